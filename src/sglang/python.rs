//! The interpreter that runs SGLang's transfer (`sglang-driver/`): the
//! `--sglang-python` flag, else `KVGEOM_SGLANG_PYTHON`, else the project's
//! `.sglang-venv/bin/python` (scripts/install-sglang.sh).

use std::path::{Path, PathBuf};

use crate::driver::{project_root, DriverKind, DriverRun, NixlRun};

/// The environment variable naming the interpreter.
pub const ENV: &str = "KVGEOM_SGLANG_PYTHON";

/// SGLang's driver, as the shared driver room names it.
pub static SGLANG_DRIVER: DriverKind = DriverKind {
    stack: "SGLang",
    nixl_install_hint: "install NIXL's Python package into that interpreter with \
         `scripts/install-sglang.sh --nixl` (nixl==1.5.1 and nixl-cu13==1.5.1)",
};

/// Why there is no interpreter to run SGLang's transfer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PythonError {
    /// The interpreter named (or the project's venv) is not a file.
    #[error(
        "no SGLang interpreter at {} ({from}): scripts/install-sglang.sh installs SGLang 0.5.23 \
         into .sglang-venv/, or name one with --sglang-python PATH or {env}",
        python.display(),
        env = ENV
    )]
    NoInterpreter {
        /// Where it was looked for.
        python: PathBuf,
        /// Who named it: the flag, the environment variable or the venv.
        from: String,
    },
    /// `sglang-driver/driver.py` is missing.
    #[error("the SGLang driver is missing ({}): run kvgeom from its checkout", driver.display())]
    NoDriver {
        /// Where it was looked for.
        driver: PathBuf,
    },
}

/// The interpreter and the driver it runs.
#[derive(Clone, Debug)]
pub struct SglangPython {
    /// The interpreter.
    pub python: PathBuf,
    /// `sglang-driver/driver.py`.
    pub driver: PathBuf,
    /// What moves the bytes (`--nixl`; the stand-in unless resolved otherwise).
    pub nixl: NixlRun,
}

impl SglangPython {
    /// The driver this interpreter runs, as the shared room's errors name
    /// it (SGLang's version is read by the driver, not before).
    pub fn driver_run(&self) -> DriverRun {
        DriverRun {
            kind: &SGLANG_DRIVER,
            python: self.python.clone(),
            version: None,
        }
    }
}

/// The interpreter to use, or why there is none.
pub fn find(flag: Option<&Path>) -> Result<SglangPython, PythonError> {
    let root = project_root();
    let (python, from) = match (flag, std::env::var_os(ENV)) {
        (Some(p), _) => (p.to_path_buf(), "--sglang-python".to_string()),
        (None, Some(p)) if !p.is_empty() => (PathBuf::from(p), ENV.to_string()),
        _ => (
            root.join(".sglang-venv").join("bin").join("python"),
            "the project's venv".to_string(),
        ),
    };
    if !python.is_file() {
        return Err(PythonError::NoInterpreter { python, from });
    }
    let driver = root.join("sglang-driver").join("driver.py");
    if !driver.is_file() {
        return Err(PythonError::NoDriver { driver });
    }
    Ok(SglangPython {
        python,
        driver,
        nixl: NixlRun::StandIn,
    })
}
