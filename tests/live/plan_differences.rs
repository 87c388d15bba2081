//! Allowed plan differences on a live sweep: a release's plan that differs
//! from the policy it is compared with fails the sweep unless the
//! plan-differences file lists the case, and a listed one is reported as
//! allowed with its finding. The difference is made by comparing vLLM
//! 0.34.0's connector with kvgeom's twin of 0.33.0 (`--compare-policy`) on
//! a geometry where the two releases' plans differ. Needs a vLLM 0.34.0
//! interpreter (`scripts/install-vllm.sh --version 0.34.0`); says why it is
//! skipped without one.

use std::path::PathBuf;
use std::process::Output;

use kvgeom::live;
use kvgeom::under_test::Release;
use serde_json::Value;

use crate::support::{kvgeom, root, scratch, skip};

/// The release the test runs.
const VERSION: &str = "0.34.0";

/// An interpreter with vLLM 0.34.0: `KVGEOM_VLLM_PYTHON`, the release's
/// venv under `.vllm-venvs/`, or the project's venv when it has that
/// release; `None` after saying why the test is skipped.
fn release_python(test: &str) -> Option<PathBuf> {
    let mut candidates: Vec<PathBuf> = std::env::var_os("KVGEOM_VLLM_PYTHON")
        .map(PathBuf::from)
        .into_iter()
        .collect();
    candidates.push(root().join(".vllm-venvs").join(VERSION).join("bin/python"));
    candidates.push(root().join(".vllm-venv/bin/python"));
    for python in candidates.iter().filter(|p| p.exists()) {
        if let Ok(found) = live::find(Some(python), Release::pinned().version) {
            if found.vllm_version == VERSION {
                return Some(python.clone());
            }
        }
    }
    skip(
        test,
        format_args!("no vLLM {VERSION} interpreter (tried {candidates:?})"),
    );
    None
}

/// `sweep --connector vllm` of gqa-prefill-logical-larger, pull, mainline,
/// direct, prompts 2 (where 0.33.0's and 0.34.0's plans differ) and 9
/// (where they agree), compared with `--policy vllm-0.33.0`, allowing what
/// `allowed` lists.
fn sweep(python: &std::path::Path, allowed: &std::path::Path) -> (Output, Value) {
    let dir = allowed.parent().expect("a folder");
    let report = dir.join(format!(
        "{}.json",
        allowed.file_stem().unwrap().to_string_lossy()
    ));
    let out = kvgeom(&[
        "sweep",
        "--connector",
        "vllm",
        "--vllm-python",
        python.to_str().unwrap(),
        "--requests",
        "direct",
        "--mode",
        "pull",
        "--alloc",
        "mainline",
        "--prompts",
        "2,9",
        "--no-shrink",
        "--compare-policy",
        "vllm-0.33.0",
        "--plan-differences",
        allowed.to_str().unwrap(),
        "--format",
        "json",
        "--out",
        report.to_str().unwrap(),
        "geometries/gqa-prefill-logical-larger.toml",
    ]);
    let text = std::fs::read_to_string(&report).unwrap_or_default();
    let json = serde_json::from_str(&text).unwrap_or_else(|e| {
        panic!(
            "no JSON report ({e}): {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out, json)
}

fn entry(cases: &str) -> String {
    format!(
        "[[difference]]\ngeometry = \"gqa-prefill-logical-larger\"\nmode = \"pull\"\n\
         requests = \"direct\"\ncases = {cases}\n\
         finding = \"vllm-0.33.0-end-trim-alignment.md\"\n\
         reason = \"0.34.0 no longer end-aligns the block lists as 0.33.0 does\"\n"
    )
}

#[test]
fn a_listed_plan_difference_is_allowed_and_an_unlisted_one_fails() {
    let test = "a_listed_plan_difference_is_allowed_and_an_unlisted_one_fails";
    let Some(python) = release_python(test) else {
        return;
    };
    let dir = scratch(module_path!(), "allowed");
    let finding = "docs/findings/vllm-0.33.0-end-trim-alignment.md";

    let listed = dir.join("listed.toml");
    std::fs::write(&listed, entry("[\"2/0\"]")).unwrap();
    let (out, report) = sweep(&python, &listed);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.contains(&format!("allowed ({finding})")), "{err}");
    assert!(
        err.contains("--policy vllm-0.33.0 plan, each an allowed plan difference"),
        "{err}"
    );
    assert!(!err.contains("--policy vllm-0.33.0 plan\n"), "{err}");
    let cases = report["cases"].as_array().expect("cases");
    assert_eq!(cases.len(), 2, "{report}");
    for case in cases {
        assert_eq!(case["policy"], "vllm-0.33.0", "{case}");
        match case["prompt_len"].as_u64() {
            Some(2) => {
                assert_eq!(case["plan"]["equal"], false, "{case}");
                assert_eq!(case["plan"]["allowed"], finding, "{case}");
            }
            Some(9) => {
                assert_eq!(case["plan"]["equal"], true, "{case}");
                assert!(case["plan"].get("allowed").is_none(), "{case}");
            }
            other => panic!("unexpected prompt {other:?}"),
        }
    }

    let unlisted = dir.join("unlisted.toml");
    std::fs::write(&unlisted, entry("[\"3/0\"]")).unwrap();
    let (out, report) = sweep(&python, &unlisted);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(
            "1 of 2 cases: vLLM's transfers differ from kvgeom's --policy vllm-0.33.0 plan\n"
        ),
        "{err}"
    );
    assert!(
        err.contains(
            "difference #1 (gqa-prefill-logical-larger pull direct) allowed no plan difference"
        ),
        "{err}"
    );
    let cases = report["cases"].as_array().expect("cases");
    assert!(
        cases.iter().all(|c| c["plan"].get("allowed").is_none()),
        "{report}"
    );
}
