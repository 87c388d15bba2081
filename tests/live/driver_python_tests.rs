//! The driver's own Python tests (`vllm-driver/test_*.py`: vLLM's scheduler
//! side, the provenance of the installed vLLM), run by pytest in the
//! project's vLLM venv, so that `cargo test` and CI run them too.

use std::process::Command;

use kvgeom::live;
use kvgeom::under_test::Release;

use crate::support::{root, skip, vllm_install_command, vllm_venv_python};

#[test]
fn the_drivers_python_tests_pass_under_pytest() {
    let test = "the_drivers_python_tests_pass_under_pytest";
    let python = match live::find(None, Release::pinned().version) {
        // Absolute, not resolved: the venv's `python` is a symlink whose
        // folder makes it the venv's; pytest runs from vllm-driver/.
        Ok(p) => std::path::absolute(&p.python).expect("the current folder is readable"),
        Err(why) => return skip(test, format_args!("no vLLM venv ({why})")),
    };
    pytest_passes(&python);
}

/// The same tests on vLLM 0.33.0, the release before the pinned one (its
/// push accepts different P/D block sizes, which 0.34.0 refuses, so the
/// push-ordering tests run there).
#[test]
fn the_drivers_python_tests_pass_under_pytest_on_0_33_0() {
    let test = "the_drivers_python_tests_pass_under_pytest_on_0_33_0";
    let python = vllm_venv_python("0.33.0");
    if !python.exists() {
        return skip(
            test,
            format_args!(
                "vLLM 0.33.0 is not installed at {} (run {})",
                python.display(),
                vllm_install_command("0.33.0")
            ),
        );
    }
    pytest_passes(&python);
}

/// Every `vllm-driver/test_*.py` under pytest with `python`: all pass.
fn pytest_passes(python: &std::path::Path) {
    let driver = root().join("vllm-driver");
    let tests: Vec<_> = std::fs::read_dir(&driver)
        .expect("vllm-driver/ is listed")
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .filter(|name| name.starts_with("test_") && name.ends_with(".py"))
        .collect();
    assert!(
        tests.iter().any(|t| t == "test_provenance.py"),
        "the driver's tests are not where this test looks: {tests:?}"
    );
    let out = Command::new(python)
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
        .args(&tests)
        .current_dir(&driver)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("the venv's python starts");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "pytest failed on {}:\n{text}",
        python.display()
    );
    assert!(text.contains(" passed"), "pytest ran no test:\n{text}");
}
