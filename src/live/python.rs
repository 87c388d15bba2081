//! Finding the Python interpreter that has vLLM installed, and its version.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::process::run_bounded;

/// The script that installs the project's venv.
pub const INSTALL_SCRIPT: &str = "scripts/install-vllm.sh";
/// The vLLM version the project's venv pins and the expectations describe.
pub const PINNED_VLLM: &str = "0.33.0";
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

/// An interpreter with vLLM importable.
#[derive(Clone, Debug)]
pub struct Interpreter {
    /// The interpreter to start.
    pub python: PathBuf,
    /// Where it was found (`--vllm-python`, the environment or the project's venv).
    pub source: Source,
    /// `vllm`'s installed version (package metadata; vLLM is not imported).
    pub vllm_version: String,
}

impl Interpreter {
    /// Whether the installed vLLM is the pinned one.
    pub fn is_pinned(&self) -> bool {
        self.vllm_version == PINNED_VLLM
    }
}

/// The project root: the current directory when it holds the driver,
/// else the source tree kvgeom was built from.
pub fn project_root() -> PathBuf {
    let cwd = PathBuf::from(".");
    if cwd.join("vllm-driver").join("driver.py").is_file() {
        return cwd;
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
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

/// Find the interpreter and check its vLLM. The error names the install
/// script (the caller exits 2 with it).
pub fn find(flag: Option<&Path>) -> Result<Interpreter, String> {
    let (python, source) = candidate(flag);
    let hint = format!("install the project's venv with `{INSTALL_SCRIPT}`");
    let named = match source {
        Source::Flag => format!("--vllm-python {}", python.display()),
        Source::Env => format!("{PYTHON_ENV}={}", python.display()),
        Source::ProjectVenv => python.display().to_string(),
    };
    if !python.is_file() {
        return Err(format!(
            "no Python interpreter at {named}: {hint} (or name one with --vllm-python PATH or {PYTHON_ENV})"
        ));
    }
    let mut cmd = Command::new(&python);
    cmd.args([
        "-c",
        "import importlib.metadata as m; print(m.version('vllm'))",
    ]);
    let scratch = std::env::temp_dir().join(format!("kvgeom-vllm-probe-{}", std::process::id()));
    let done = run_bounded(cmd, &scratch, Duration::from_secs(60));
    let _ = std::fs::remove_dir_all(&scratch);
    let done = done.map_err(|e| format!("{named}: {e}; {hint}"))?;
    if done.timed_out() {
        return Err(format!(
            "{named}: asking for vLLM's version took over 60 s; {hint}"
        ));
    }
    if done.status != Some(0) {
        return Err(format!(
            "{named} has no vLLM installed ({}); {hint}",
            done.stderr_tail(1).trim()
        ));
    }
    let vllm_version = done.stdout.trim().to_string();
    if source == Source::ProjectVenv && vllm_version != PINNED_VLLM {
        return Err(format!(
            "{named} has vLLM {vllm_version}, not the pinned {PINNED_VLLM}; {hint}"
        ));
    }
    Ok(Interpreter {
        python,
        source,
        vllm_version,
    })
}
