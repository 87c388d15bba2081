//! A connector developer's branch under test: vLLM 0.34.0's sdist as a git
//! tree with the patches of tests/fixtures/vllm-branch/ uncommitted
//! (`scripts/fetch-vllm-sdist.sh`), installed Python-only into
//! target/vllm-src/venv/ (`scripts/install-vllm.sh --source`). The branch
//! adds a `ReqMeta` field that the pull connector's scheduler half fills
//! (the prompt tokens decode already holds in its prefix cache) and its
//! worker records (a JSON line per request in the file
//! `VLLM_NIXL_RECORD_REQ_META` names), and renames the private push helper
//! `_send_registration_to_p` that the driver patches. Without the tree or
//! the venv each test prints why it is skipped and returns.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::support::{kvgeom_with_env, root, scratch, skip, text};

const GEOMETRY: &str = "geometries/llama-gqa-prefix-cache.toml";
const RECORD_ENV: &str = "VLLM_NIXL_RECORD_REQ_META";

/// The patched tree and its venv's Python, or why they are not there.
fn branch() -> Result<(PathBuf, PathBuf), String> {
    let dir = root().join("target/vllm-src");
    let tree = dir.join("vllm-0.34.0");
    let python = dir.join("venv/bin/python");
    if !tree.join(".git").is_dir() {
        return Err(format!(
            "no patched vLLM tree at {} (scripts/fetch-vllm-sdist.sh)",
            tree.display()
        ));
    }
    if !python.is_file() {
        return Err(format!(
            "no venv at {} (scripts/install-vllm.sh --source target/vllm-src/vllm-0.34.0 \
             --venv target/vllm-src/venv --torch-from .vllm-venv)",
            python.display()
        ));
    }
    Ok((tree, python))
}

/// `kvgeom sweep` of the prefix-cache geometry's pull cases at 20 prompt
/// tokens (prefix hits 0 and 16) on the branch, with `requests` made by
/// vLLM's scheduler or directly: the JSON report and what the worker
/// recorded, one value per `_read_blocks_for_req` call.
fn sweep(python: &Path, requests: &str, dir: &Path) -> (Value, Vec<u64>) {
    let record = dir.join(format!("{requests}.jsonl"));
    let report = dir.join(format!("{requests}.json"));
    let out = kvgeom_with_env(
        &[
            "sweep",
            "--connector",
            "vllm",
            "--vllm-python",
            &python.to_string_lossy(),
            "--requests",
            requests,
            "--mode",
            "pull",
            "--alloc",
            "mainline",
            "--prompts",
            "20",
            "--format",
            "json",
            "--out",
            &report.to_string_lossy(),
            GEOMETRY,
        ],
        &[(RECORD_ENV, &record.to_string_lossy())],
    );
    assert_eq!(out.status.code(), Some(0), "{requests}: {}", text(&out));
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&report).unwrap())
        .unwrap_or_else(|e| panic!("{requests}: the report is not JSON ({e})"));
    let seen = std::fs::read_to_string(&record)
        .unwrap_or_default()
        .lines()
        .map(|line| {
            let v: Value = serde_json::from_str(line).expect("a recorded JSON line");
            v["local_computed_tokens"]
                .as_u64()
                .unwrap_or_else(|| panic!("no local_computed_tokens in {line}"))
        })
        .collect();
    (report, seen)
}

/// The distinct values of `values`, sorted.
fn distinct(values: impl IntoIterator<Item = u64>) -> Vec<u64> {
    let mut v: Vec<u64> = values.into_iter().collect();
    v.sort_unstable();
    v.dedup();
    v
}

#[test]
fn a_field_the_branchs_scheduler_fills_reaches_its_worker_only_through_the_scheduler() {
    let test = "a_field_the_branchs_scheduler_fills_reaches_its_worker_only_through_the_scheduler";
    let (tree, python) = match branch() {
        Ok(found) => found,
        Err(why) => return skip(test, why),
    };
    let dir = scratch(module_path!(), "field");

    let (report, seen) = sweep(&python, "scheduler", &dir);
    let cases = report["cases"].as_array().expect("cases");
    let hits = distinct(cases.iter().map(|c| c["prefix_hit"].as_u64().unwrap()));
    assert_eq!(hits, [0, 16], "the geometry's hits at 20 tokens");
    for case in cases {
        assert_eq!(case["request_path"], "scheduler", "{case}");
        assert_eq!(case["passed"], true, "{case}");
    }
    // Each case's request reached the worker with the hit vLLM's scheduler
    // counted (its locally computed tokens), the hit of 16 included.
    assert_eq!(distinct(seen.iter().copied()), hits, "recorded: {seen:?}");

    // The report names what ran: the tree, its commit, its local changes.
    let code = &report["code_under_test"];
    let commit = std::process::Command::new("git")
        .args(["-C", &tree.to_string_lossy(), "rev-parse", "HEAD"])
        .output()
        .expect("git runs");
    let commit = String::from_utf8_lossy(&commit.stdout).trim().to_string();
    assert_eq!(
        code["source"]["path"],
        tree.to_string_lossy().as_ref(),
        "{code}"
    );
    assert_eq!(code["source"]["commit"], commit.as_str(), "{code}");
    assert_eq!(code["source"]["dirty"], true, "{code}");
    // setuptools-scm names a tree with local changes on the v0.34.0 tag by
    // the next release's dev version (0.34.1.dev0+g<commit>.d<date>).
    assert!(
        code["version"]
            .as_str()
            .is_some_and(|v| v.starts_with("0.34.")),
        "{code}"
    );
    assert_eq!(
        code["policy"],
        Value::Null,
        "a branch is no release: {code}"
    );

    // Requests the driver builds itself leave the field at its default,
    // the hit of 16 included: the comparison above can fail.
    let (report, seen) = sweep(&python, "direct", &dir);
    let cases = report["cases"].as_array().expect("cases");
    assert!(
        cases.iter().all(|c| c["request_path"] == "direct"),
        "{report}"
    );
    assert!(cases.iter().any(|c| c["prefix_hit"] == 16), "{report}");
    assert!(
        !seen.is_empty(),
        "the worker recorded nothing on the direct path"
    );
    assert_eq!(distinct(seen.iter().copied()), [0], "recorded: {seen:?}");
}

#[test]
fn the_api_check_names_the_helper_the_branch_renamed_with_exit_2() {
    let test = "the_api_check_names_the_helper_the_branch_renamed_with_exit_2";
    let (_, python) = match branch() {
        Ok(found) => found,
        Err(why) => return skip(test, why),
    };
    let out = kvgeom_with_env(
        &[
            "sweep",
            "--connector",
            "vllm",
            "--vllm-python",
            &python.to_string_lossy(),
            "--requests",
            "direct",
            "--mode",
            "push",
            "--prompts",
            "20",
            GEOMETRY,
        ],
        &[],
    );
    let all = text(&out);
    assert_eq!(out.status.code(), Some(2), "{all}");
    assert!(
        all.contains("NixlPushConnectorWorker._send_registration_to_p"),
        "{all}"
    );
    assert!(!all.contains("Traceback"), "{all}");
}
