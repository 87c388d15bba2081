//! SGLang's driver's own Python tests (`sglang-driver/test_*.py`: the NIXL
//! stand-in against real NIXL's refusals, SGLang 0.5.23's transfer run by
//! its own threads on a CPU, #31295 on the last release before its fix),
//! run by pytest in the project's SGLang venv (`scripts/install-sglang.sh`,
//! or the interpreter `KVGEOM_SGLANG_PYTHON` names), so that `cargo test`
//! and CI run them. Without the venv the test says why it is skipped; a
//! driver test pytest skips (an optional venv or wheel missing) is named
//! the same way, so CI, which installs them all, fails on it.

use std::path::PathBuf;
use std::process::Command;

use crate::support::{root, skip};

/// The interpreter with SGLang: `KVGEOM_SGLANG_PYTHON`, else the project's
/// `.sglang-venv/`.
fn sglang_python() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("KVGEOM_SGLANG_PYTHON").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let venv = root().join(".sglang-venv").join("bin").join("python");
    venv.exists().then_some(venv)
}

#[test]
fn the_sglang_drivers_python_tests_pass_under_pytest() {
    let test = "the_sglang_drivers_python_tests_pass_under_pytest";
    let Some(python) = sglang_python() else {
        return skip(
            test,
            "no SGLang venv (scripts/install-sglang.sh, or KVGEOM_SGLANG_PYTHON)",
        );
    };
    let driver = root().join("sglang-driver");
    let out = Command::new(&python)
        .args(["-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "."])
        .current_dir(&driver)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .unwrap_or_else(|e| panic!("{} does not start: {e}", python.display()));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "pytest failed:\n{text}");
    assert!(text.contains(" passed"), "pytest ran no test:\n{text}");
    // pytest's `-rs` lines: `SKIPPED [1] FILE:LINE: REASON`.
    for line in text.lines().filter(|l| l.starts_with("SKIPPED")) {
        skip(test, format_args!("a driver test was skipped: {line}"));
    }
}
