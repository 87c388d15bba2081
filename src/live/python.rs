//! Finding the Python interpreter that has vLLM installed: its version and
//! provenance (`vllm-driver/provenance.py`: installed files that differ from
//! their RECORD hashes, or the git checkout it is).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::connector::NamedPolicy;
use crate::driver::{
    address_space_limit, memory_failure, project_root, run_bounded, scratch_for, DriverKind,
    DriverRun, NixlRun, ProcessError,
};
use crate::under_test::{CodeUnderTest, Release, SourceTree};

/// The script that installs the project's venv.
pub const INSTALL_SCRIPT: &str = "scripts/install-vllm.sh";
/// vLLM's driver, as the shared driver room names it.
pub static VLLM_DRIVER: DriverKind = DriverKind {
    stack: "vLLM",
    nixl_install_hint: "install the nixl wheels into the driver's interpreter with \
         `scripts/install-vllm.sh --nixl` (pinned nixl==1.5.1 and nixl-cu13==1.5.1)",
};
/// The environment variable naming another interpreter.
pub const PYTHON_ENV: &str = "KVGEOM_VLLM_PYTHON";
/// The project-local venv, relative to the project root.
pub const PROJECT_VENV: &str = ".vllm-venv";

/// Where the interpreter came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// `--vllm-python PATH`.
    Flag,
    /// `KVGEOM_VLLM_PYTHON`.
    Env,
    /// `<project>/.vllm-venv/bin/python`.
    ProjectVenv,
}

/// The interpreter tried, as its messages name it: the flag, the variable
/// or the venv path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// The interpreter.
    pub python: PathBuf,
    /// Where it was named.
    pub found_by: Source,
}

impl std::fmt::Display for Candidate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let python = self.python.display();
        match self.found_by {
            Source::Flag => write!(f, "--vllm-python {python}"),
            Source::Env => write!(f, "{PYTHON_ENV}={python}"),
            Source::ProjectVenv => write!(f, "{python}"),
        }
    }
}

/// How long asking the interpreter for vLLM's version may take.
const PROBE_LIMIT: Duration = Duration::from_secs(60);

/// Why no usable interpreter was found. Every message ends with how to
/// install the project's venv.
#[derive(Debug, thiserror::Error)]
pub enum FindError {
    /// Nothing at the candidate path.
    #[error(
        "no Python interpreter at {candidate}: install the project's venv with \
         `{INSTALL_SCRIPT}` (or name one with --vllm-python PATH or {PYTHON_ENV})"
    )]
    Missing {
        /// The interpreter tried.
        candidate: Candidate,
    },
    /// The interpreter could not be run.
    #[error("{candidate}: {error}; install the project's venv with `{INSTALL_SCRIPT}`")]
    Probe {
        /// The interpreter tried.
        candidate: Candidate,
        /// Why it did not run.
        #[source]
        error: ProcessError,
    },
    /// The interpreter did not answer in time.
    #[error(
        "{candidate}: asking for vLLM's version took over {} s; install the project's venv \
         with `{INSTALL_SCRIPT}`",
        limit.as_secs()
    )]
    ProbeTimedOut {
        /// The interpreter tried.
        candidate: Candidate,
        /// How long it was given.
        limit: Duration,
    },
    /// The interpreter could not start within this process's memory
    /// limits (an address-space limit, no memory left).
    #[error(
        "{candidate} cannot run within the memory this process may use: {message}{}; raise the \
         address-space limit or free memory",
        limit.map_or(String::new(), |l| format!(
            " (address-space limit {})",
            crate::scenario::memory_estimate::human_bytes(l)
        ))
    )]
    OutOfMemory {
        /// The interpreter tried.
        candidate: Candidate,
        /// The line of its output that says so.
        message: String,
        /// The address-space limit in bytes, if one is set.
        limit: Option<u64>,
    },
    /// The interpreter has no `vllm` package.
    #[error(
        "{candidate} has no vLLM installed ({stderr}); install the project's venv with \
         `{INSTALL_SCRIPT}`"
    )]
    NoVllm {
        /// The interpreter tried.
        candidate: Candidate,
        /// The last line the interpreter wrote to stderr.
        stderr: String,
    },
    /// The project's venv has another vLLM than the pinned one.
    #[error(
        "{candidate} has vLLM {version}, not the pinned {pinned}; install the project's \
         venv with `{INSTALL_SCRIPT}`"
    )]
    NotPinned {
        /// The interpreter tried.
        candidate: Candidate,
        /// The vLLM version it has.
        version: String,
        /// The version the project's venv pins.
        pinned: String,
    },
}

/// An interpreter with vLLM importable.
#[derive(Clone, Debug)]
pub struct Interpreter {
    /// The interpreter to start.
    pub python: PathBuf,
    /// Where it was found (`--vllm-python`, the environment or the project's venv).
    pub source: Source,
    /// `vllm`'s installed version (package metadata; vLLM is not imported).
    pub vllm_version: String,
    /// What moves the driver's bytes: the stand-in unless the caller
    /// resolved `--nixl` to real NIXL ([`crate::driver::resolve`]).
    pub nixl: NixlRun,
    /// The kvgeom policy that models the installed release: `None` unless
    /// the caller found it in the release table (`under_test::Release`);
    /// with `None` every plan comparison is information only.
    pub reference: Option<NamedPolicy>,
    /// Where the installed vLLM came from.
    pub provenance: Provenance,
}

impl Interpreter {
    /// The kvgeom policy its plans are compared with: its release's
    /// reference when it has one, otherwise, as information, the policy of
    /// the newest modelled release before its version
    /// (`Release::nearest_vllm`).
    pub fn compared_policy(&self) -> NamedPolicy {
        self.reference
            .unwrap_or_else(|| Release::nearest_vllm(&self.vllm_version).policy)
    }

    /// vLLM's connector as this interpreter has it installed: its version,
    /// and the files that differ from the release's or the checkout it is.
    /// Only an unmodified install of a release in the table is that release.
    pub fn code_under_test(&self) -> CodeUnderTest {
        let mut code = CodeUnderTest::vllm(&self.vllm_version);
        code.modified_files = self.provenance.modified_files.clone();
        code.substitutions = self.provenance.substitutions.clone();
        code.source = self.provenance.source.as_ref().map(|c| SourceTree {
            path: c.path.clone(),
            commit: c.commit.clone(),
            dirty: c.dirty,
        });
        if code.release().is_none() {
            code.policy = None;
        }
        code
    }

    /// The driver this interpreter runs, as the shared room's errors name it.
    pub fn driver_run(&self) -> DriverRun {
        DriverRun {
            kind: &VLLM_DRIVER,
            python: self.python.clone(),
            version: Some(self.vllm_version.clone()),
        }
    }
}

/// Where an interpreter's vLLM came from, as `vllm-driver/provenance.py`
/// reads it without importing vLLM.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Deserialize)]
pub struct Provenance {
    /// The installed package's files whose bytes differ from the hashes of
    /// its dist-info RECORD (or that are gone), as RECORD names them.
    pub modified_files: Vec<String>,
    /// The git checkout whose working tree the package is (an editable or
    /// source install), else `None`.
    pub source: Option<Checkout>,
    /// The release's dependency pins the install replaced because the
    /// package index lacks them (the venv's `.kvgeom-substitutions`).
    #[serde(default)]
    pub substitutions: Vec<String>,
}

/// A git checkout of vLLM.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize)]
pub struct Checkout {
    /// Its top folder.
    pub path: String,
    /// Its `HEAD` commit.
    pub commit: String,
    /// Whether tracked files have local changes.
    pub dirty: bool,
}

/// What the provenance probe prints.
#[derive(serde::Deserialize)]
struct Probed {
    version: String,
    #[serde(flatten)]
    provenance: Provenance,
}

/// The driver script.
pub fn driver_script() -> PathBuf {
    project_root().join("vllm-driver").join("driver.py")
}

/// The candidate interpreter: the flag, else the environment, else the project venv.
pub fn candidate(flag: Option<&Path>) -> (PathBuf, Source) {
    if let Some(p) = flag {
        return (p.to_path_buf(), Source::Flag);
    }
    if let Some(p) = std::env::var_os(PYTHON_ENV).filter(|v| !v.is_empty()) {
        return (PathBuf::from(p), Source::Env);
    }
    (
        project_root().join(PROJECT_VENV).join("bin").join("python"),
        Source::ProjectVenv,
    )
}

/// Find the interpreter and check its vLLM (the project's venv must hold
/// `pinned`, the release it pins). The error names the install script (the
/// caller exits 2 with it).
pub fn find(flag: Option<&Path>, pinned: &str) -> Result<Interpreter, FindError> {
    let (python, source) = candidate(flag);
    let candidate = Candidate {
        python: python.clone(),
        found_by: source,
    };
    if !python.is_file() {
        return Err(FindError::Missing { candidate });
    }
    let mut cmd = Command::new(&python);
    cmd.arg(project_root().join("vllm-driver").join("provenance.py"));
    let scratch = scratch_for("vllm-probe");
    let done = run_bounded(cmd, &scratch, PROBE_LIMIT);
    let _ = std::fs::remove_dir_all(&scratch);
    let done = match done {
        Ok(done) => done,
        Err(error) => return Err(FindError::Probe { candidate, error }),
    };
    if done.timed_out() {
        return Err(FindError::ProbeTimedOut {
            candidate,
            limit: PROBE_LIMIT,
        });
    }
    if done.status != Some(0) {
        if let Some(message) = memory_failure(&done.stderr) {
            return Err(FindError::OutOfMemory {
                candidate,
                message,
                limit: address_space_limit(),
            });
        }
        return Err(FindError::NoVllm {
            candidate,
            stderr: done.stderr_tail(1).trim().to_string(),
        });
    }
    let Ok(Probed {
        version: vllm_version,
        provenance,
    }) = serde_json::from_str::<Probed>(done.stdout.trim())
    else {
        return Err(FindError::NoVllm {
            candidate,
            stderr: format!(
                "vllm-driver/provenance.py printed no provenance: {}",
                done.stdout.trim()
            ),
        });
    };
    if source == Source::ProjectVenv && vllm_version != pinned {
        return Err(FindError::NotPinned {
            candidate,
            version: vllm_version,
            pinned: pinned.to_string(),
        });
    }
    Ok(Interpreter {
        python,
        source,
        vllm_version,
        nixl: NixlRun::StandIn,
        reference: None,
        provenance,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn installed(provenance: Provenance) -> CodeUnderTest {
        let python = Interpreter {
            python: "python".into(),
            source: Source::Flag,
            vllm_version: "0.33.0".into(),
            nixl: crate::driver::NixlRun::StandIn,
            reference: None,
            provenance,
        };
        python.code_under_test()
    }

    #[test]
    fn a_substituted_dependency_is_reported_and_keeps_the_release() {
        use crate::live::python::Provenance;
        let line = "flashinfer-python==0.7.3 -> flashinfer-python==0.7.4 (the pin is not on the package index)";
        let code = installed(Provenance {
            substitutions: vec![line.into()],
            ..Provenance::default()
        });
        assert!(code.release().is_some(), "vLLM's own code is the release's");
        let json = serde_json::to_value(&code).expect("JSON");
        assert_eq!(json["substitutions"], serde_json::json!([line]));
        let plain = serde_json::to_value(installed(Provenance::default())).expect("JSON");
        assert!(
            plain.get("substitutions").is_none(),
            "absent when none: {plain}"
        );
    }

    #[test]
    fn a_modified_install_or_a_checkout_of_a_release_is_not_that_release() {
        let plain = installed(Provenance::default());
        assert_eq!(plain, CodeUnderTest::vllm("0.33.0"));
        assert_eq!(plain.describe(), "vLLM 0.33.0");
        let modified = installed(Provenance {
            modified_files: vec!["vllm/a.py".into(), "vllm/b.py (deleted)".into()],
            ..Provenance::default()
        });
        assert_eq!(modified.describe(), "vLLM 0.33.0, modified: 2 files");
        assert!(modified.release().is_none());
        assert_eq!(
            (modified.policy.as_deref(), modified.expectations()),
            (None, None)
        );
        let json = serde_json::to_value(installed(Provenance {
            modified_files: vec!["vllm/a.py".into()],
            ..Provenance::default()
        }))
        .expect("JSON");
        assert_eq!(json["modified_files"], serde_json::json!(["vllm/a.py"]));
        let tree = installed(Provenance {
            modified_files: Vec::new(),
            source: Some(Checkout {
                path: "/src/vllm".into(),
                commit: "0123456789abcdef0123".into(),
                dirty: true,
            }),
            ..Provenance::default()
        });
        assert_eq!(
            tree.describe(),
            "vLLM 0.33.0 from /src/vllm at 0123456789ab, with local changes"
        );
        assert_eq!(tree.reference_policy(), None);
        assert!(tree.source.as_ref().is_some_and(|t| t.dirty));
    }

    #[test]
    fn a_missing_interpreter_is_named_as_it_was_given_with_the_install_hint() {
        let python = Path::new("/nonexistent/kvgeom/python");
        let e = find(Some(python), "0.33.0").unwrap_err();
        assert!(
            matches!(&e, FindError::Missing { candidate } if candidate.found_by == Source::Flag),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "no Python interpreter at --vllm-python /nonexistent/kvgeom/python: install the \
             project's venv with `scripts/install-vllm.sh` (or name one with --vllm-python PATH \
             or KVGEOM_VLLM_PYTHON)"
        );
        let env = Candidate {
            python: python.to_path_buf(),
            found_by: Source::Env,
        };
        assert_eq!(
            env.to_string(),
            "KVGEOM_VLLM_PYTHON=/nonexistent/kvgeom/python"
        );
    }

    #[test]
    fn an_interpreter_that_does_not_start_keeps_the_process_error() {
        // A file that exists but cannot be executed.
        let python = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
        let e = find(Some(&python), "0.33.0").unwrap_err();
        let FindError::Probe { error, .. } = &e else {
            panic!("expected a probe error, got {e:?}");
        };
        assert!(matches!(error, ProcessError::Start { .. }), "{error:?}");
        assert!(
            e.to_string().starts_with(&format!(
                "--vllm-python {}: cannot start {:?}: ",
                python.display(),
                python
            )),
            "{e}"
        );
    }
}
