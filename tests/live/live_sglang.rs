//! `--connector sglang`: SGLang's own P/D transfer under kvgeom's SGLang
//! oracles. The tests that run SGLang need its venv
//! (`scripts/install-sglang.sh`, or `KVGEOM_SGLANG_PYTHON`) and say why
//! they are skipped without it; the refusals and a bad interpreter are
//! checked everywhere.

use std::path::PathBuf;

use kvgeom::scenario::Outcome;
use kvgeom::sweep::plan;

use crate::support::{json_report, kvgeom, kvgeom_with_env, root, skip, text};

/// The interpreter with SGLang, as `kvgeom` finds it.
fn sglang_python() -> Option<kvgeom::sglang::python::SglangPython> {
    kvgeom::sglang::python::find(None).ok()
}

#[test]
fn kvgeoms_model_of_sglangs_pools_matches_every_rank_of_every_file() {
    let test = "kvgeoms_model_of_sglangs_pools_matches_every_rank_of_every_file";
    let Some(python) = sglang_python() else {
        return skip(
            test,
            "no SGLang venv (scripts/install-sglang.sh, or KVGEOM_SGLANG_PYTHON)",
        );
    };
    // And a V head smaller than K's on the head-slice path, which SGLang
    // 0.5.23 plans past prefill's V regions: NIXL refuses the list.
    let dir = tempdir("v-small");
    let v_small = dir.join("v-head-size-smaller-p1-d2.toml");
    let text = std::fs::read_to_string(root().join("geometries/sglang/gqa-v-head-size-p1-d2.toml"))
        .expect("geometry")
        .replace("v_head_size = 16", "v_head_size = 4");
    std::fs::write(&v_small, text).expect("write");
    let sources =
        plan::load_sources(&[root().join("geometries/sglang"), v_small]).expect("geometries");
    assert!(sources.len() >= 12, "{} files", sources.len());
    let opts = plan::PlanOptions {
        prompts: Some(vec![5]),
        modes: vec![kvgeom::geometry::Mode::Push],
        allocations: Some(vec![kvgeom::scheduler::DecodeAllocation::Mainline]),
        ..plan::PlanOptions::default()
    };
    let cases = plan::grid(&sources, &opts);
    assert_eq!(cases.len(), sources.len());
    let judged = kvgeom::sglang::connector::run_sweep(&cases, &python).expect("the driver runs");
    // Hybrid files: kvgeom's model of the state tensors (shape, slice
    // metadata, conv sub-blocks) agreed with SGLang's on every rank, or the
    // case would be an error below.
    let hybrid = judged
        .iter()
        .filter(|j| {
            let g = &j.report.case.geometry;
            g.sglang.as_ref().is_some_and(|s| s.state.is_some())
        })
        .count();
    assert!(hybrid >= 6, "{hybrid} hybrid files");
    for j in &judged {
        let g = &j.report.case.geometry;
        let name = g.name.as_str();
        assert!(
            !matches!(j.report.outcome, Outcome::Error { .. }),
            "{name}: {}",
            j.report.outcome.describe()
        );
        if name == "v-head-size-smaller-p1-d2" {
            let text = j.report.outcome.describe();
            assert!(
                matches!(j.report.outcome, Outcome::Crashed { .. })
                    && text.contains("NIXL_ERR_NOT_FOUND")
                    && text.contains("SGLang's _prep_xfer_dlist"),
                "{text}"
            );
        }
        // Every rank of both engines was built (the page-size mismatch is
        // refused after the pools exist) and agreed with the model.
        assert_eq!(
            j.layout_checked,
            g.prefill.tp_size + g.decode.tp_size,
            "{name}: ranks compared"
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn the_sglang_sweep_fails_exactly_where_its_expectations_say() {
    let test = "the_sglang_sweep_fails_exactly_where_its_expectations_say";
    if sglang_python().is_none() {
        return skip(
            test,
            "no SGLang venv (scripts/install-sglang.sh, or KVGEOM_SGLANG_PYTHON)",
        );
    }
    let o = kvgeom(&[
        "sweep",
        "--connector",
        "sglang",
        "geometries/sglang/",
        "--expect",
        "expected/sglang-0.5.23.toml",
        "--format",
        "json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let report = json_report(&o);
    let code = &report["code_under_test"];
    assert_eq!(code["connector"], "sglang");
    assert_eq!(code["version"], "0.5.23");
    assert!(code["torch"].as_str().is_some_and(|t| !t.is_empty()));
    let cases = report["cases"].as_array().expect("cases");
    let of = |name: &'static str| cases.iter().filter(move |c| c["geometry"] == name);
    assert!(of("reject-page-size-mismatch")
        .all(|c| c["outcome"]["kind"] == "expected_rejection" && c["passed"] == true));
    // Replicated prefill ranks each write the decode head: identical bytes,
    // counted, never a violation.
    assert!(of("gqa-2heads-p4-d1")
        .all(|c| c["passed"] == true && c["redundant_writes"].as_u64() > Some(0)));
    assert!(of("gqa-v-head-size-p1-d2").all(|c| c["passed"] == false));
    assert!(cases.iter().all(|c| c["mode"] == "push"));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("every case runs in push mode"), "{stderr}");
}

#[test]
fn a_missing_or_broken_sglang_interpreter_is_exit_2_without_a_traceback() {
    let o = kvgeom(&[
        "sweep",
        "--connector",
        "sglang",
        "geometries/sglang/mha-equal-tp.toml",
        "--sglang-python",
        "/nonexistent/python",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("no SGLang interpreter at /nonexistent/python"),
        "{}",
        text(&o)
    );
    let o = kvgeom_with_env(
        &[
            "sweep",
            "--connector",
            "sglang",
            "geometries/sglang/mha-equal-tp.toml",
        ],
        &[("KVGEOM_SGLANG_PYTHON", "/nonexistent/env-python")],
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("KVGEOM_SGLANG_PYTHON"), "{}", text(&o));
    // An interpreter that runs but is no Python with SGLang.
    let dir = tempdir("broken");
    let fake = dir.join("python");
    write_script(&fake, "echo 'Traceback (most recent call last):' >&2\necho 'ModuleNotFoundError: No module named torch' >&2\nexit 1\n");
    let o = run_with(&fake);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("No module named torch") && !err.contains("Traceback"),
        "{err}"
    );
    // An SGLang the driver cannot drive (the driver's exit 3).
    write_script(
        &fake,
        "echo 'driver: this SGLang (0.9.0 (torch 3.0)) lacks what the driver needs:' >&2\necho '  - NixlKVManager._prep_xfer_dlist: prepares the lists' >&2\nexit 3\n",
    );
    let o = run_with(&fake);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("cannot be driven") && err.contains("_prep_xfer_dlist"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

fn tempdir(what: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("kvgeom-live-sglang-{what}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

fn write_script(path: &std::path::Path, body: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, format!("#!/bin/sh\n{body}")).expect("script");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
}

fn run_with(python: &std::path::Path) -> std::process::Output {
    kvgeom(&[
        "sweep",
        "--connector",
        "sglang",
        "geometries/sglang/mha-equal-tp.toml",
        "--prompts",
        "5",
        "--sglang-python",
        python.to_str().expect("utf-8 path"),
    ])
}

#[test]
fn options_of_other_connectors_and_pull_are_refused_and_vllm_files_skipped() {
    let file = "geometries/sglang/mha-equal-tp.toml";
    for (args, says) in [
        (
            vec!["--mode", "pull"],
            "--mode pull: SGLang's P/D transfer is push",
        ),
        (vec!["--alloc", "mainline"], "--alloc"),
        (vec!["--policy", "vllm-0.33.0"], "--policy vllm-0.33.0"),
        (vec!["--vllm-python", "/x"], "--vllm-python /x"),
        (vec!["--memory", "vram"], "--memory vram"),
    ] {
        let mut all = vec!["sweep", "--connector", "sglang", file];
        all.extend(args);
        let o = kvgeom(&all);
        assert_eq!(o.status.code(), Some(2), "{all:?}: {}", text(&o));
        assert!(text(&o).contains(says), "{all:?}: {}", text(&o));
    }
    let o = kvgeom(&["sweep", "--sglang-python", "/x", file]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("add --connector sglang"), "{}", text(&o));
    // vLLM's files only: nothing to judge.
    let o = kvgeom(&[
        "sweep",
        "--connector",
        "sglang",
        "geometries/g1-mla-kda-ppl3-vs-2.toml",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("no SGLang geometry"), "{}", text(&o));
    // Mixed: vLLM's skipped with one note (then the missing interpreter).
    let o = kvgeom(&[
        "sweep",
        "--connector",
        "sglang",
        "geometries/g1-mla-kda-ppl3-vs-2.toml",
        file,
        "--sglang-python",
        "/nonexistent/python",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("note: 1 vLLM-stack geometries skipped"),
        "{}",
        text(&o)
    );
}

#[test]
fn explain_shows_one_sglang_case_with_its_pools_and_redundant_writes() {
    let test = "explain_shows_one_sglang_case_with_its_pools_and_redundant_writes";
    if sglang_python().is_none() {
        return skip(
            test,
            "no SGLang venv (scripts/install-sglang.sh, or KVGEOM_SGLANG_PYTHON)",
        );
    }
    let o = kvgeom(&[
        "explain",
        "--connector",
        "sglang",
        "geometries/sglang/gqa-2heads-p4-d1.toml",
        "--prompt",
        "5",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    for needle in [
        "prefill-3: heads [1]",
        "decode-0: heads [0, 1]",
        "ranks whose registered regions match kvgeom's model: 5",
        "outcome: passed",
    ] {
        assert!(out.contains(needle), "{needle}: {out}");
    }
    assert!(!out.contains("redundant writes: 0 pairs"), "{out}");
}
