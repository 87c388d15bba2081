//! An installed `kvgeom` (the binary copied out of the build, as `cargo
//! install --path .` puts it on PATH) run from a folder that is no
//! checkout finds the checkout's `geometries/` and `vllm-driver/`, so the
//! README's commands work from anywhere.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::support::text;

/// A fresh folder outside the checkout.
fn outside(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kvgeom-installed-{}-{test}", std::process::id()));
    if dir.exists() {
        fs::remove_dir_all(&dir).unwrap();
    }
    fs::create_dir_all(&dir).unwrap();
    dir
}

/// The binary copied into `dir/bin` and a working folder `dir/cwd`.
fn install(test: &str) -> (PathBuf, PathBuf) {
    let dir = outside(test);
    let bin = dir.join("bin");
    let cwd = dir.join("cwd");
    fs::create_dir_all(&bin).unwrap();
    fs::create_dir_all(&cwd).unwrap();
    let kvgeom = bin.join("kvgeom");
    fs::copy(env!("CARGO_BIN_EXE_kvgeom"), &kvgeom).unwrap();
    assert!(!cwd.join("geometries").exists());
    (kvgeom, cwd)
}

fn run(kvgeom: &Path, cwd: &Path, args: &[&str]) -> Output {
    Command::new(kvgeom)
        .args(args)
        .current_dir(cwd)
        .env_remove("KVGEOM_VLLM_PYTHON")
        .output()
        .expect("the installed kvgeom runs")
}

#[test]
fn sweep_from_another_folder_runs_the_checkouts_geometries() {
    let (kvgeom, cwd) = install("sweep");
    let out = run(&kvgeom, &cwd, &["sweep", "--random", "3", "--seed", "1"]);
    let all = text(&out);
    assert_eq!(out.status.code(), Some(0), "{all}");
    assert!(all.contains("3 passed, 0 failed"), "{all}");
    assert!(!all.contains("cannot read"), "{all}");
}

#[test]
fn the_report_names_the_checkouts_files() {
    let (kvgeom, cwd) = install("files");
    let out = run(
        &kvgeom,
        &cwd,
        &["sweep", "--random", "2", "--seed", "3", "--format", "json"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let checkout = Path::new(env!("CARGO_MANIFEST_DIR")).join("geometries");
    let cases = report["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 2);
    // Each case's file (and so its replay command) is the checkout's.
    for case in cases {
        let file = Path::new(case["file"].as_str().unwrap());
        assert!(file.starts_with(&checkout), "{}", file.display());
        assert!(file.is_file(), "{}", file.display());
    }
}

#[test]
fn the_live_mode_from_another_folder_finds_the_checkouts_driver_and_venv() {
    let (kvgeom, cwd) = install("live");
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join(".vllm-venv/bin/python");
    let out = run(
        &kvgeom,
        &cwd,
        &[
            "sweep",
            "--connector",
            "vllm",
            "--random",
            "1",
            "--seed",
            "1",
        ],
    );
    let all = text(&out);
    if venv.is_file() {
        // The checkout's venv and driver ran the case.
        assert!(matches!(out.status.code(), Some(0 | 1)), "{all}");
        assert!(all.contains("connector: vllm"), "{all}");
        assert!(all.contains(&venv.display().to_string()), "{all}");
    } else {
        // The checkout's venv is the one looked for, and the error says how
        // to make it.
        assert_eq!(out.status.code(), Some(2), "{all}");
        assert!(all.contains(&venv.display().to_string()), "{all}");
        assert!(all.contains("scripts/install-vllm.sh"), "{all}");
    }
}
