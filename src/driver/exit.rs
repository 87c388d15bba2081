//! A driver process launched and its ending classified, once for every
//! stack: the driver's script run bounded ([`run_driver`]), and a failure
//! status read as the one [`DriverError`] it is: the interpreter short of
//! memory, the installed package lacking what the driver drives (the
//! driver's API-drift exit, [`API_DRIFT_STATUS`]), real NIXL unavailable
//! ([`UNAVAILABLE_STATUS`]), or any other failure with the
//! last lines of its stderr. A driver that ran to its end, or was stopped
//! at its deadline, is the caller's to read.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::process::{run_bounded, Finished, ProcessError};

/// The driver's exit status when the installed package lacks classes or
/// methods the driver drives; it lists each on stderr as `  - NAME: why`.
pub const API_DRIFT_STATUS: i32 = 3;

/// The driver's exit status (and its probe's) when real NIXL was asked
/// for and cannot run.
pub const UNAVAILABLE_STATUS: i32 = 4;

/// Lines of stderr a failed driver's error quotes.
const FAILURE_LINES: usize = 15;

/// One stack's Python driver, as its errors name it.
#[derive(Debug)]
pub struct DriverKind {
    /// The stack it drives, as messages name it (`vLLM`, `SGLang`).
    pub stack: &'static str,
    /// How to install NIXL's Python package into its interpreter.
    pub nixl_install_hint: &'static str,
}

/// The driver that ran: its stack, interpreter and, where known, the
/// stack's installed version.
#[derive(Clone, Debug)]
pub struct DriverRun {
    /// Which driver.
    pub kind: &'static DriverKind,
    /// The interpreter that ran it.
    pub python: PathBuf,
    /// The installed stack's version, where the probe read it.
    pub version: Option<String>,
}

impl std::fmt::Display for DriverRun {
    /// `vLLM 0.33.0 (/path/python)`, or `SGLang (/path/python)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.version {
            Some(v) => write!(f, "{} {v} ({})", self.kind.stack, self.python.display()),
            None => write!(f, "{} ({})", self.kind.stack, self.python.display()),
        }
    }
}

/// Why a driver could not run a batch at all (the caller exits 2): a
/// failure of kvgeom's driver or its interpreter, never a verdict.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// The driver's script is not where it should be.
    #[error("the driver is missing: {}", script.display())]
    Missing {
        /// Where the driver was looked for.
        script: PathBuf,
    },
    /// The driver's interpreter could not be run.
    #[error(transparent)]
    Process(#[from] ProcessError),
    /// The installed package lacks classes or methods the driver drives
    /// (another release than the driver's: a branch or a pull request).
    #[error(
        "{run} cannot be driven: it lacks what the driver needs:\n  - {}",
        missing.join("\n  - ")
    )]
    ApiDrift {
        /// The driver that ran.
        run: DriverRun,
        /// Each missing name, with what the driver uses it for.
        missing: Vec<String>,
    },
    /// Real NIXL was asked for and does not run in the driver's interpreter.
    #[error(
        "--nixl real: the {} driver ({}) cannot run real NIXL: {message}; {}",
        run.kind.stack,
        run.python.display(),
        run.kind.nixl_install_hint
    )]
    NixlUnavailable {
        /// The driver that ran.
        run: DriverRun,
        /// What the driver said.
        message: String,
    },
    /// The driver could not start (or ran out) within this process's memory
    /// limits: Python or its libraries could not map or allocate memory
    /// (an address-space limit set with `ulimit -v`, no memory left).
    #[error(
        "the {} driver ({}) cannot run within the memory this process may use: {message}{}; \
         raise the address-space limit or free memory",
        run.kind.stack,
        run.python.display(),
        limit.map_or(String::new(), |l| format!(
            " (address-space limit {})",
            crate::scenario::memory_estimate::human_bytes(l)
        ))
    )]
    OutOfMemory {
        /// The driver that ran.
        run: DriverRun,
        /// The line of its output that says so.
        message: String,
        /// The address-space limit in bytes, if one is set.
        limit: Option<u64>,
    },
    /// The driver ended with a failure status before its time-out (or, for
    /// a phase that must finish, was stopped at it: `status` `None`).
    #[error(
        "the {} driver ({}) {}:\n{stderr_tail}",
        run.kind.stack,
        run.python.display(),
        status.map_or("was stopped (killed at its deadline or by a signal)".to_string(), |s| format!("failed with exit status {s}"))
    )]
    Failed {
        /// The driver that ran.
        run: DriverRun,
        /// Its exit status (`None`: killed at its deadline or by a signal).
        status: Option<i32>,
        /// The last lines it wrote to stderr, Python tracebacks reduced to
        /// their exception line.
        stderr_tail: String,
    },
}

impl DriverError {
    /// The failure of a driver that ended as `done` did, with nothing more
    /// specific to say.
    pub fn failed(run: &DriverRun, done: &Finished) -> Self {
        DriverError::Failed {
            run: run.clone(),
            status: done.status,
            stderr_tail: error_tail(&done.stderr, FAILURE_LINES),
        }
    }

    /// Whether the driver ran and ended with a failure status (as opposed
    /// to not starting at all): a batch whose cases wrote their results
    /// before the failure may still be read.
    pub fn ended_with_a_status(&self) -> bool {
        matches!(
            self,
            DriverError::NixlUnavailable { .. }
                | DriverError::OutOfMemory { .. }
                | DriverError::Failed { .. }
        )
    }
}

/// Run `script` with `args` under `run`'s interpreter, its output captured
/// in `scratch` and stopped at `limit`. `Ok` when it ended with status 0 or
/// was stopped at its deadline ([`Finished::timed_out`]); any other
/// ending is the [`DriverError`] it is.
pub fn run_driver(
    run: &DriverRun,
    script: &Path,
    args: &[&std::ffi::OsStr],
    scratch: &Path,
    limit: Duration,
) -> Result<Finished, DriverError> {
    if !script.is_file() {
        return Err(DriverError::Missing {
            script: script.to_path_buf(),
        });
    }
    let mut cmd = Command::new(&run.python);
    cmd.arg(script).args(args);
    let done = run_bounded(cmd, scratch, limit)?;
    match classify(run, &done) {
        Some(error) => Err(error),
        None => Ok(done),
    }
}

/// What a driver's ending says went wrong; `None` for status 0 or a stop at
/// the deadline.
pub fn classify(run: &DriverRun, done: &Finished) -> Option<DriverError> {
    let status = done.status?;
    if status == 0 {
        return None;
    }
    if let Some(message) = memory_failure(&done.stderr) {
        return Some(DriverError::OutOfMemory {
            run: run.clone(),
            message,
            limit: address_space_limit(),
        });
    }
    if status == API_DRIFT_STATUS {
        return Some(DriverError::ApiDrift {
            run: run.clone(),
            missing: done
                .stderr
                .lines()
                .filter_map(|l| l.trim_start().strip_prefix("- "))
                .map(str::to_string)
                .collect(),
        });
    }
    if status == UNAVAILABLE_STATUS {
        return Some(DriverError::NixlUnavailable {
            run: run.clone(),
            message: done
                .stderr
                .lines()
                .rev()
                .find_map(|l| l.split_once("real NIXL: ").map(|(_, said)| said))
                .map(|l| l.split("; install ").next().unwrap_or(l))
                .unwrap_or("the driver's probe failed")
                .to_string(),
        });
    }
    Some(DriverError::failed(run, done))
}

/// What a Python driver or probe wrote when it could not get memory: an
/// import that could not map a library, `MemoryError`, a failed thread or
/// allocation. The first such line, trimmed; `None` for any other failure.
pub fn memory_failure(stderr: &str) -> Option<String> {
    const SIGNS: [&str; 8] = [
        "failed to map segment from shared object",
        "MemoryError",
        "Cannot allocate memory",
        "cannot allocate memory",
        "std::bad_alloc",
        "out of memory",
        "pthread_create failed",
        "memory allocation failed",
    ];
    stderr
        .lines()
        .map(str::trim)
        .find(|l| SIGNS.iter().any(|s| l.contains(s)))
        .map(|l| {
            // The driver's list of names it could not import: the reason only.
            let l = match l.split_once("the module does not import: ") {
                Some((_, why)) => why.strip_suffix(')').unwrap_or(why),
                None => l,
            };
            l.chars().take(300).collect()
        })
}

/// This process's address-space limit in bytes, if one is set.
pub fn address_space_limit() -> Option<u64> {
    crate::scenario::memory_estimate::AddressSpace::current().map(|a| a.limit)
}

/// The last `lines` non-empty lines of `stderr`, each Python traceback
/// reduced to its exception line: the header and the indented frames
/// below it are left out, so that a user reads what failed, not where.
pub fn error_tail(stderr: &str, lines: usize) -> String {
    let mut kept: Vec<&str> = Vec::new();
    let mut in_traceback = false;
    for line in stderr.lines() {
        if line.starts_with("Traceback (most recent call last)") {
            in_traceback = true;
            continue;
        }
        if in_traceback && (line.starts_with(' ') || line.starts_with('\t')) {
            continue;
        }
        in_traceback = false;
        if !line.trim().is_empty() {
            kept.push(line.trim_end());
        }
    }
    kept[kept.len().saturating_sub(lines)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    static TEST_DRIVER: DriverKind = DriverKind {
        stack: "Stack",
        nixl_install_hint: "install it",
    };

    fn run() -> DriverRun {
        DriverRun {
            kind: &TEST_DRIVER,
            python: PathBuf::from("/py"),
            version: Some("1.0".into()),
        }
    }

    fn ended(status: Option<i32>, stderr: &str) -> Finished {
        Finished {
            status,
            stdout: String::new(),
            stderr: stderr.to_string(),
        }
    }

    #[test]
    fn a_driver_short_of_memory_is_told_apart() {
        let import = "Traceback (most recent call last):\n  File \"x\", line 1\n\
                      ImportError: libtorch_cpu.so: failed to map segment from shared object\n";
        assert_eq!(
            memory_failure(import).as_deref(),
            Some("ImportError: libtorch_cpu.so: failed to map segment from shared object")
        );
        assert_eq!(
            memory_failure("Traceback\nMemoryError\n").as_deref(),
            Some("MemoryError")
        );
        assert_eq!(memory_failure("ValueError: bad block size\n"), None);
    }

    #[test]
    fn each_ending_is_classified_once_for_every_stack() {
        assert!(classify(&run(), &ended(Some(0), "")).is_none());
        assert!(classify(&run(), &ended(None, "stopped")).is_none());
        let drift = classify(
            &run(),
            &ended(Some(3), "driver: lacks:\n  - Foo.bar: moves\n  - baz\n"),
        );
        match &drift {
            Some(DriverError::ApiDrift { missing, .. }) => {
                assert_eq!(missing, &["Foo.bar: moves", "baz"])
            }
            other => panic!("{other:?}"),
        }
        let text = drift.unwrap().to_string();
        assert!(
            text.starts_with("Stack 1.0 (/py) cannot be driven: it lacks what the driver needs:"),
            "{text}"
        );
        for said in [
            "driver: real NIXL: no agent; install the nixl wheels",
            "real NIXL: no agent; install NIXL's package",
        ] {
            match classify(&run(), &ended(Some(4), said)) {
                Some(DriverError::NixlUnavailable { message, .. }) => {
                    assert_eq!(message, "no agent")
                }
                other => panic!("{other:?}"),
            }
        }
        assert!(matches!(
            classify(&run(), &ended(Some(1), "MemoryError")),
            Some(DriverError::OutOfMemory { .. })
        ));
        match classify(&run(), &ended(Some(1), "bad\n")) {
            Some(e @ DriverError::Failed { .. }) => {
                assert!(e.ended_with_a_status());
                assert_eq!(
                    e.to_string(),
                    "the Stack driver (/py) failed with exit status 1:\nbad"
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_traceback_is_reduced_to_its_exception_line() {
        let stderr = "note: starting\nTraceback (most recent call last):\n  File \"d.py\", \
                      line 3, in <module>\n    import torch\nModuleNotFoundError: No module \
                      named 'torch'\n\n";
        assert_eq!(
            error_tail(stderr, 15),
            "note: starting\nModuleNotFoundError: No module named 'torch'"
        );
        assert_eq!(
            error_tail(stderr, 1),
            "ModuleNotFoundError: No module named 'torch'"
        );
    }

    #[test]
    fn a_missing_script_is_named_before_anything_runs() {
        let e = run_driver(
            &run(),
            Path::new("/nonexistent/driver.py"),
            &[],
            Path::new("/nonexistent/scratch"),
            Duration::from_secs(1),
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "the driver is missing: /nonexistent/driver.py"
        );
    }
}
