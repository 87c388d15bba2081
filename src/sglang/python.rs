//! The interpreter that runs SGLang's transfer (`sglang-driver/`): the
//! `--sglang-python` flag, else `KVGEOM_SGLANG_PYTHON`, else the project's
//! `.sglang-venv/bin/python` (scripts/install-sglang.sh).

use std::path::{Path, PathBuf};

use super::error::PythonError;

/// The environment variable naming the interpreter.
pub const ENV: &str = "KVGEOM_SGLANG_PYTHON";

/// The interpreter and the driver it runs.
#[derive(Clone, Debug)]
pub struct SglangPython {
    /// The interpreter.
    pub python: PathBuf,
    /// `sglang-driver/driver.py`.
    pub driver: PathBuf,
}

/// The interpreter to use, or why there is none.
pub fn find(flag: Option<&Path>) -> Result<SglangPython, PythonError> {
    let root = crate::live::python::project_root();
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
    Ok(SglangPython { python, driver })
}
