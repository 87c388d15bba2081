//! SGLang's history through kvgeom's verdict: a release before a fix and
//! one after it, on the geometry of the bug, each through `kvgeom sweep
//! --connector sglang --sglang-python X`. Needs `.sglang-venvs/0.5.16`
//! (`scripts/install-sglang.sh --version 0.5.16`) and the default
//! `.sglang-venv` (0.5.23); says `skipped: <reason>` without them.

use crate::support::{json_report, kvgeom, root, scratch, skip, text};

/// Every case of `file` on the interpreter `python` (relative to the
/// checkout), as the sweep's JSON report.
fn sweep(python: &str, file: &str, prompts: &str) -> (std::process::Output, serde_json::Value) {
    let o = kvgeom(&[
        "sweep",
        "--connector",
        "sglang",
        "--sglang-python",
        python,
        file,
        "--prompts",
        prompts,
        "--no-shrink",
        "--format",
        "json",
    ]);
    let report = json_report(&o);
    (o, report)
}

/// SGLang #31295 (2 KV heads, prefill attention TP1 -> decode TP4), fixed by
/// PR #31968, first in 0.5.17: 0.5.16 crashes with the NIXL stand-in's
/// out-of-region refusal of the list SGLang's planner built; 0.5.23 passes.
#[test]
fn sglang_31295_crashes_on_0_5_16_and_passes_on_0_5_23() {
    let test = "sglang_31295_crashes_on_0_5_16_and_passes_on_0_5_23";
    let before = ".sglang-venvs/0.5.16/bin/python";
    let after = ".sglang-venv/bin/python";
    for p in [before, after] {
        if !root().join(p).exists() {
            return skip(
                test,
                format!("no {p} (scripts/install-sglang.sh [--version 0.5.16])"),
            );
        }
    }
    let file = "geometries/sglang/gqa-2heads-p1-d4.toml";
    let (o, report) = sweep(before, file, "5,9");
    // Exit 0: the crash is what expected/sglang-0.5.16.toml lists for it.
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("expected/sglang-0.5.16.toml"),
        "{}",
        text(&o)
    );
    assert_eq!(report["code_under_test"]["version"], "0.5.16");
    let cases = report["cases"].as_array().expect("cases");
    assert_eq!(cases.len(), 2);
    for c in cases {
        assert_eq!(c["outcome"]["kind"], "crashed", "{c}");
        let said = c.to_string();
        assert!(
            said.contains("NIXL_ERR_NOT_FOUND")
                && said.contains("_init_hetero_tp_prep_handle")
                && said.contains("lies in none of this agent's registered VRAM regions"),
            "{said}"
        );
    }
    let (o, report) = sweep(after, file, "5,9");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(report["code_under_test"]["version"], "0.5.23");
    let cases = report["cases"].as_array().expect("cases");
    assert_eq!(cases.len(), 2);
    assert!(cases.iter().all(|c| c["passed"] == true), "{report}");
}

/// The same release 0.5.16 passes the shapes it handles (equal TP, MLA,
/// prefill TP above decode's): the crash above is SGLang's, not the
/// driver's adaptation to 0.5.16's older API.
#[test]
fn sglang_0_5_16_passes_the_shapes_it_handles() {
    let test = "sglang_0_5_16_passes_the_shapes_it_handles";
    let before = ".sglang-venvs/0.5.16/bin/python";
    if !root().join(before).exists() {
        return skip(
            test,
            format!("no {before} (scripts/install-sglang.sh --version 0.5.16)"),
        );
    }
    let o = kvgeom(&[
        "sweep",
        "--connector",
        "sglang",
        "--sglang-python",
        before,
        "geometries/sglang/mha-equal-tp.toml",
        "geometries/sglang/gqa-8heads-p2-d4.toml",
        "geometries/sglang/mla-p2-d1.toml",
        "--prompts",
        "5",
        "--no-shrink",
        "--format",
        "json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let report = json_report(&o);
    let cases = report["cases"].as_array().expect("cases");
    assert_eq!(cases.len(), 3, "{report}");
    assert!(cases.iter().all(|c| c["passed"] == true), "{report}");
}

/// A failing SGLang case is shrunk to the smallest prompt that fails the
/// same way, in one more driver batch, and its replay names that prompt
/// (without `--sglang-python` for the project's own venv).
#[test]
fn sglang_failures_shrink_to_a_smaller_prompt() {
    let test = "sglang_failures_shrink_to_a_smaller_prompt";
    let python = ".sglang-venv/bin/python";
    if !root().join(python).exists() {
        return skip(test, format!("no {python} (scripts/install-sglang.sh)"));
    }
    // A failure expected/sglang-0.5.23.toml names, held to a file that
    // names none: unexpected (exit 1), so replayed, shrunk.
    let none = scratch(module_path!(), test).join("no-failures.toml");
    std::fs::write(&none, "# no failure is expected\n").expect("write the expectations");
    let o = kvgeom(&[
        "sweep",
        "--connector",
        "sglang",
        "--sglang-python",
        python,
        "geometries/sglang/gqa-v-head-size-p1-d2.toml",
        "--prompts",
        "9",
        "--expect",
        &none.to_string_lossy(),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let stderr = String::from_utf8_lossy(&o.stderr);
    let replay = stderr
        .split("minimal replays:")
        .nth(1)
        .and_then(|rest| rest.lines().find(|l| l.contains("replay: ")))
        .unwrap_or_else(|| panic!("no minimal replay: {stderr}"));
    let prompt: u32 = replay
        .split("--prompt ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no prompt in {replay}"));
    assert!(prompt < 9, "{replay}");
    assert!(!replay.contains("--sglang-python"), "{replay}");
    assert!(
        replay.contains(
            "kvgeom explain --connector sglang geometries/sglang/gqa-v-head-size-p1-d2.toml"
        ),
        "{replay}"
    );
}

/// A trace folder that cannot be made is exit 2 naming it; a v3 trace of
/// kvgeom's block layout relabelled as SGLang's is refused by
/// `check-trace` (it is not an SGLang trace) and by `sweep --connector
/// replay` with the reason, never judged on kvgeom's block layout.
#[test]
fn sglang_traces_are_refused_with_the_reason() {
    let not_a_folder = crate::support::root().join("Cargo.toml").join("traces");
    let o = kvgeom(&[
        "sweep",
        "--connector",
        "sglang",
        "geometries/sglang/mha-equal-tp.toml",
        "--sglang-python",
        "/nonexistent/python",
        "--record-traces",
        not_a_folder.to_str().expect("utf-8"),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("--record-traces"), "{}", text(&o));
    let dir = crate::support::scratch(module_path!(), "sglang-v3");
    let o = kvgeom(&[
        "sweep",
        "geometries/deepseek-mla.toml",
        "--prompts",
        "4",
        "--mode",
        "push",
        "--alloc",
        "mainline",
        "--record-traces",
        dir.to_str().expect("utf-8"),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let gz = std::fs::read_dir(&dir)
        .expect("traces")
        .map(|e| e.expect("entry").path())
        .find(|p| p.to_string_lossy().ends_with(".trace.json.gz"))
        .expect("a v3 trace");
    let mut json = String::new();
    std::io::Read::read_to_string(
        &mut flate2::read::GzDecoder::new(std::fs::File::open(&gz).expect("open")),
        &mut json,
    )
    .expect("gunzip");
    let mut v: serde_json::Value = serde_json::from_str(&json).expect("json");
    assert_eq!(v["format"], "kvgeom-trace/3");
    v["code_under_test"] = serde_json::json!({
        "connector": "sglang", "version": "0.5.23", "policy": null, "source": null
    });
    let sglang = dir.join("sglang.trace.json");
    std::fs::write(&sglang, v.to_string()).expect("write");
    let o = kvgeom(&["check-trace", sglang.to_str().expect("utf-8")]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("not an SGLang trace"), "{}", text(&o));
    let o = kvgeom(&[
        "sweep",
        "--connector",
        "replay",
        sglang.to_str().expect("utf-8"),
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("an SGLang trace") && text(&o).contains("check-trace"),
        "{}",
        text(&o)
    );
}
