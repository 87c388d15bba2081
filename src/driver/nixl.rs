//! Which NIXL moves the bytes of a driver's cases, for every stack: the
//! driver's stand-in (`fake_nixl.py`, everywhere) or real NIXL agents over
//! host memory (the driver's `real_nixl.py`, where the `nixl` Python
//! package loads in the driver's interpreter), probed once per command.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::exit::DriverKind;
use super::process::{run_bounded, ProcessError};

/// The probe's answer on stdout, before the version (`real_nixl.py`).
const VERSION_PREFIX: &str = "real NIXL version ";
/// How long the probe (import NIXL, two agents, a READ and a WRITE) may take.
const PROBE_LIMIT: Duration = Duration::from_secs(120);

/// What the user asked for (`--nixl`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NixlChoice {
    /// The driver's stand-in (the default: it needs nothing beyond vLLM).
    #[default]
    StandIn,
    /// Real NIXL, or an error naming what to install.
    Real,
    /// Real NIXL where it runs, else the stand-in.
    Auto,
}

/// What moves the bytes of a batch.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum NixlRun {
    /// The driver's stand-in: `ctypes.memmove` between the tensors.
    #[default]
    StandIn,
    /// Real NIXL agents (UCX backend) over host memory.
    Real {
        /// The installed NIXL version, as the driver's probe reports it.
        version: String,
    },
}

impl NixlRun {
    /// The value of `nixl` in `batch.json` and in each `result.json`.
    pub fn as_str(&self) -> &'static str {
        match self {
            NixlRun::StandIn => "stand-in",
            NixlRun::Real { .. } => "real",
        }
    }

    /// The real NIXL's version, `None` for the stand-in.
    pub fn version(&self) -> Option<&str> {
        match self {
            NixlRun::StandIn => None,
            NixlRun::Real { version } => Some(version),
        }
    }
}

impl std::fmt::Display for NixlRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NixlRun::StandIn => write!(f, "the driver's NIXL stand-in"),
            NixlRun::Real { version } => write!(f, "real NIXL {version} (UCX, host memory)"),
        }
    }
}

/// Why real NIXL cannot run in the driver's interpreter.
#[derive(Debug, thiserror::Error)]
#[error("--nixl real: {}: {message}; {}", python.display(), driver.nixl_install_hint)]
pub struct NixlUnavailable {
    /// The driver whose interpreter was probed.
    pub driver: &'static DriverKind,
    /// The driver's interpreter.
    pub python: PathBuf,
    /// What the probe said.
    pub message: String,
}

/// The resolved choice, and for `auto` falling back to the stand-in, why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    /// What will move the bytes.
    pub run: NixlRun,
    /// Why `auto` chose the stand-in.
    pub note: Option<String>,
}

/// Resolve `choice` for `driver`'s interpreter `python`: `real` and `auto`
/// run the driver's probe (`DRIVER_DIR/real_nixl.py --probe`: import NIXL,
/// create two agents, move bytes with a READ and a WRITE and deliver their
/// notifications).
pub fn resolve(
    driver: &'static DriverKind,
    python: &Path,
    driver_dir: &Path,
    choice: NixlChoice,
) -> Result<Resolved, NixlUnavailable> {
    if choice == NixlChoice::StandIn {
        return Ok(Resolved {
            run: NixlRun::StandIn,
            note: None,
        });
    }
    match probe(python, driver_dir) {
        Ok(version) => Ok(Resolved {
            run: NixlRun::Real { version },
            note: None,
        }),
        Err(e) if choice == NixlChoice::Auto => Ok(Resolved {
            run: NixlRun::StandIn,
            note: Some(e.to_string()),
        }),
        Err(e) => Err(NixlUnavailable {
            driver,
            python: python.to_path_buf(),
            message: e.to_string(),
        }),
    }
}

/// Why the probe says real NIXL does not run.
#[derive(Debug, thiserror::Error)]
enum ProbeError {
    #[error("the driver's {} is missing", .0.display())]
    ScriptMissing(PathBuf),
    #[error(transparent)]
    Start(#[from] ProcessError),
    #[error("the probe (two agents moving a few bytes) took over {} s", .0.as_secs())]
    TimedOut(Duration),
    /// The driver's own message (without its install hint).
    #[error("{0}")]
    Refused(String),
    #[error("the probe failed ({status}): {stderr_tail}")]
    Failed { status: String, stderr_tail: String },
}

/// The NIXL version when real NIXL runs in `python`, else why not.
fn probe(python: &Path, driver_dir: &Path) -> Result<String, ProbeError> {
    let script = driver_dir.join("real_nixl.py");
    if !script.is_file() {
        return Err(ProbeError::ScriptMissing(script));
    }
    let mut cmd = Command::new(python);
    // -B: the probe leaves no __pycache__ in the project, as the driver does not.
    cmd.arg("-B").arg(&script).arg("--probe");
    let scratch = super::scratch::scratch_for("nixl-probe");
    let done = run_bounded(cmd, &scratch, PROBE_LIMIT);
    let _ = std::fs::remove_dir_all(&scratch);
    let done = done?;
    if done.timed_out() {
        return Err(ProbeError::TimedOut(PROBE_LIMIT));
    }
    let version = done
        .stdout
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix(VERSION_PREFIX));
    if let (Some(0), Some(version)) = (done.status, version) {
        return Ok(version.trim().to_string());
    }
    // The driver's message without its install hint (the error adds it).
    let said = done
        .stderr
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("real NIXL: "))
        .map(|l| {
            l.split("; install the nixl wheels")
                .next()
                .unwrap_or(l)
                .to_string()
        });
    match said {
        Some(said) => Err(ProbeError::Refused(said)),
        None => Err(ProbeError::Failed {
            status: done.status.map_or_else(
                || "killed by a signal".to_string(),
                |s| format!("status {s}"),
            ),
            stderr_tail: done.stderr_tail(3).trim().to_string(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static TEST_DRIVER: DriverKind = DriverKind {
        stack: "Stack",
        nixl_install_hint: "install the nixl wheels with `install.sh --nixl`",
    };

    fn resolve(python: &str, choice: NixlChoice) -> Result<Resolved, NixlUnavailable> {
        let driver = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("vllm-driver");
        super::resolve(&TEST_DRIVER, Path::new(python), &driver, choice)
    }

    #[test]
    fn the_stand_in_needs_no_probe() {
        let r = resolve("/nonexistent/python", NixlChoice::StandIn).unwrap();
        assert_eq!(r.run, NixlRun::StandIn);
        assert_eq!(r.note, None);
    }

    #[test]
    fn real_without_a_runnable_interpreter_names_what_to_install() {
        let e = resolve("/nonexistent/python", NixlChoice::Real).unwrap_err();
        let text = e.to_string();
        assert!(
            text.starts_with("--nixl real: /nonexistent/python: cannot start"),
            "{text}"
        );
        assert!(
            text.ends_with("; install the nixl wheels with `install.sh --nixl`"),
            "{text}"
        );
    }

    #[test]
    fn auto_falls_back_to_the_stand_in_and_says_why() {
        let r = resolve("/nonexistent/python", NixlChoice::Auto).unwrap();
        assert_eq!(r.run, NixlRun::StandIn);
        assert!(r.note.is_some_and(|n| n.starts_with("cannot start")));
    }

    #[test]
    fn what_ran_is_named_in_the_batch_and_in_messages() {
        let real = NixlRun::Real {
            version: "1.5.1".into(),
        };
        assert_eq!((real.as_str(), real.version()), ("real", Some("1.5.1")));
        assert_eq!(real.to_string(), "real NIXL 1.5.1 (UCX, host memory)");
        assert_eq!(
            (NixlRun::StandIn.as_str(), NixlRun::StandIn.version()),
            ("stand-in", None)
        );
    }
}
