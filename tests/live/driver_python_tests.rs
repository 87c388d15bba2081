//! The driver's own Python tests (`vllm-driver/test_*.py`: vLLM's scheduler
//! side, the provenance of the installed vLLM), run by pytest in the
//! project's vLLM venv, so that `cargo test` and CI run them too.

use std::process::Command;

use kvgeom::live;
use kvgeom::under_test::Release;

use crate::support::{root, skip};

#[test]
fn the_drivers_python_tests_pass_under_pytest() {
    let test = "the_drivers_python_tests_pass_under_pytest";
    let python = match live::find(None, Release::pinned().version) {
        // Absolute, not resolved: the venv's `python` is a symlink whose
        // folder makes it the venv's; pytest runs from vllm-driver/.
        Ok(p) => std::path::absolute(&p.python).expect("the current folder is readable"),
        Err(why) => return skip(test, format_args!("no vLLM venv ({why})")),
    };
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
    let out = Command::new(&python)
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
    assert!(out.status.success(), "pytest failed:\n{text}");
    assert!(text.contains(" passed"), "pytest ran no test:\n{text}");
}
