//! `scripts/new-vllm-release.sh` without a network or a vLLM: its argument
//! handling (exit 2 with the reason before anything is installed) and the
//! draft page it writes from stages' outputs and two installed packages.

use std::path::Path;
use std::process::{Command, Output};

use crate::support::{python_with_site, root, scratch, text};

fn script(args: &[&str]) -> Output {
    Command::new("bash")
        .arg(root().join("scripts/new-vllm-release.sh"))
        .args(args)
        .current_dir(root())
        .output()
        .expect("run bash")
}

#[test]
fn help_names_every_stage() {
    let o = script(&["--help"]);
    let all = text(&o);
    assert_eq!(o.status.code(), Some(0), "{all}");
    for stage in ["install:", "check:", "sample:", "matrix:", "page:"] {
        assert!(all.contains(stage), "{stage} missing from --help: {all}");
    }
}

#[test]
fn bad_arguments_are_exit_2_with_the_reason_before_any_install() {
    for (args, reason) in [
        (vec![], "which release?"),
        (vec!["latest"], "latest: not a vLLM release number"),
        (vec!["0.34"], "0.34: not a vLLM release number"),
        (vec!["0.34.0;rm"], "not a vLLM release number"),
        (vec!["0.34.0", "0.35.0"], "one release at a time"),
        (
            vec!["0.34.0", "--frobnicate"],
            "unknown option --frobnicate",
        ),
        (vec!["0.34.0", "--out"], "--out needs a value"),
        (
            vec!["0.34.0", "--against", "/nonexistent/kvgeom/python"],
            "--against /nonexistent/kvgeom/python: no Python interpreter there",
        ),
    ] {
        let o = script(&args);
        let all = text(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {all}");
        assert!(
            all.contains(reason),
            "{args:?}: wanted {reason:?} in: {all}"
        );
        assert!(
            !all.contains("install:"),
            "{args:?} reached the install: {all}"
        );
    }
}

/// A fake `vllm` package of `version` under `site` with the NIXL connector
/// files given.
fn fake_vllm(site: &Path, version: &str, files: &[(&str, &str)]) {
    let nixl = site.join("vllm/distributed/kv_transfer/kv_connector/v1/nixl");
    std::fs::create_dir_all(&nixl).unwrap();
    let dist = site.join(format!("vllm-{version}.dist-info"));
    std::fs::create_dir_all(&dist).unwrap();
    std::fs::write(
        dist.join("METADATA"),
        format!("Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"),
    )
    .unwrap();
    std::fs::write(site.join("vllm/__init__.py"), "").unwrap();
    for (name, body) in files {
        std::fs::write(nixl.join(name), body).unwrap();
    }
}

fn case(n: u32, kind: &str, oracles: &[&str]) -> serde_json::Value {
    let violations: Vec<_> = oracles
        .iter()
        .map(|o| serde_json::json!({"oracle": o, "message": "m"}))
        .collect();
    serde_json::json!({
        "geometry": "g", "mode": "pull", "allocation": "mainline", "prompt_len": n,
        "prefix_hit": 0, "outcome": {"kind": kind}, "violations": violations,
    })
}

#[test]
fn the_page_names_the_handshake_version_the_changed_files_and_the_changed_verdicts() {
    let dir = scratch(module_path!(), "page");
    let (old_site, new_site) = (dir.join("old-site"), dir.join("new-site"));
    fake_vllm(
        &old_site,
        "0.33.0",
        &[
            ("metadata.py", "NIXL_CONNECTOR_VERSION: int = 15\n"),
            ("base_worker.py", "x = 1\n"),
            ("__init__.py", ""),
            ("gone.py", ""),
        ],
    );
    fake_vllm(
        &new_site,
        "0.34.0",
        &[
            ("metadata.py", "NIXL_CONNECTOR_VERSION: int = 16\n"),
            ("base_worker.py", "x = 2\n"),
            ("__init__.py", ""),
        ],
    );
    let (old_bin, new_bin) = (dir.join("old-bin"), dir.join("new-bin"));
    std::fs::create_dir_all(&old_bin).unwrap();
    std::fs::create_dir_all(&new_bin).unwrap();
    let old_py = python_with_site(&old_bin, &old_site, "python3");
    let new_py = python_with_site(&new_bin, &new_site, "python3");
    let out = dir.join("out");
    std::fs::create_dir_all(&out).unwrap();
    let report = |name: &str, cases: Vec<serde_json::Value>| {
        let path = dir.join(name);
        std::fs::write(&path, serde_json::json!({"cases": cases}).to_string()).unwrap();
        path.display().to_string()
    };
    let old_report = report(
        "old.json",
        vec![case(5, "passed", &[]), case(13, "violations", &["pairing"])],
    );
    let new_report = report(
        "new.json",
        vec![case(5, "passed", &[]), case(13, "passed", &[])],
    );
    let (op, np) = (old_py.display().to_string(), new_py.display().to_string());
    let matrix = serde_json::json!({
        "releases": [
            {"python": op, "version": "0.33.0", "status": "ran", "describe": "vLLM 0.33.0",
             "cases": 2, "compared_with": "vllm-0.33.0", "report": old_report},
            {"python": np, "version": "0.34.0", "status": "ran", "describe": "vLLM 0.34.0",
             "cases": 2, "compared_with": "vllm-0.34.0", "report": new_report},
        ],
        "cells": [
            {"geometry": "g", "mode": "pull", "python": op, "passed": 1, "violations": 1, "oracles": ["pairing"]},
            {"geometry": "g", "mode": "pull", "python": np, "passed": 2, "oracles": []},
        ],
    });
    std::fs::write(out.join("matrix.json"), matrix.to_string()).unwrap();
    std::fs::write(out.join("times.txt"), "install 12 0\ncheck 3 0\n").unwrap();
    std::fs::write(
        out.join("check.txt"),
        "W1207 torch warning\nFailed to import from vllm._C\n  absent, done without: x.y (z)\n",
    )
    .unwrap();
    let o = Command::new("python3")
        .arg(root().join("scripts/new-vllm-release-page.py"))
        .args(["--version", "0.34.0", "--against", &op, "--python", &np])
        .arg("--out")
        .arg(&out)
        .output()
        .expect("run python3");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let page = std::fs::read_to_string(out.join("vllm-0.34.0.md")).unwrap();
    assert!(page.contains("**16** in 0.34.0"), "{page}");
    assert!(page.contains("15 in 0.33.0"), "{page}");
    assert!(
        page.contains("2 changed, 0 added, 1 removed, 1 unchanged"),
        "{page}"
    );
    assert!(page.contains("nixl/base_worker.py` | changed"), "{page}");
    assert!(page.contains("nixl/gone.py` | removed"), "{page}");
    assert!(
        page.contains("| g | pull | 1 ok, 1 violations [pairing] | 2 ok |"),
        "{page}"
    );
    assert!(
        page.contains("Cases whose verdict (outcome and oracles) changed: 1."),
        "{page}"
    );
    assert!(
        page.contains("| g N=13 h=0 pull mainline | violations [pairing] | passed |"),
        "{page}"
    );
    assert!(page.contains("| install | 12 | 0 |"), "{page}");
    assert!(
        page.contains("Nothing the driver needs is missing or reshaped.")
            && page.contains("absent, done without: x.y (z)")
            && !page.contains("torch warning"),
        "{page}"
    );
}
