//! SGLang's runs recorded as traces (`--record-traces`, `explain
//! --record-trace`) and judged again by `check-trace` with the sweep's
//! verdicts. Needs the SGLang venv (`scripts/install-sglang.sh`, or
//! `KVGEOM_SGLANG_PYTHON`) and says why it is skipped without it.

use std::path::Path;

use serde_json::Value;

use crate::support::{kvgeom, scratch, skip, text};

/// (file name, verdict, message) of each file check-trace judged.
fn check(path: &Path) -> (Option<i32>, Vec<(String, String, String)>) {
    let o = kvgeom(&[
        "check-trace",
        "--format",
        "json",
        path.to_str().expect("path"),
    ]);
    let report: Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("no report ({e}): {}", text(&o)));
    let files = report["files"]
        .as_array()
        .expect("files")
        .iter()
        .map(|f| {
            let file = f["file"].as_str().unwrap_or_default();
            (
                Path::new(file)
                    .file_name()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .into_owned(),
                f["verdict"].as_str().unwrap_or_default().to_string(),
                f["message"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    (o.status.code(), files)
}

#[test]
fn sglang_traces_recorded_by_sweep_and_explain_give_the_sweeps_verdicts() {
    let test = "sglang_traces_recorded_by_sweep_and_explain_give_the_sweeps_verdicts";
    if kvgeom::sglang::python::find(None).is_err() {
        return skip(
            test,
            "no SGLang venv (scripts/install-sglang.sh, or KVGEOM_SGLANG_PYTHON)",
        );
    }
    let dir = scratch(module_path!(), "sweep");
    let traces = dir.join("traces");
    let passing = "geometries/sglang/gqa-2heads-p4-d1.toml";
    let violating = "geometries/sglang/gqa-v-head-size-p1-d2.toml";
    let hybrid = "geometries/sglang/hybrid-mamba2-xbc-p1-d2.toml";
    let o = kvgeom(&[
        "sweep",
        "--connector",
        "sglang",
        passing,
        violating,
        hybrid,
        "--prompts",
        "5",
        "--format",
        "json",
        "--no-shrink",
        "--record-traces",
        traces.to_str().expect("path"),
    ]);
    let report: Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("no report ({e}): {}", text(&o)));
    let cases = report["cases"].as_array().expect("cases");
    assert_eq!(cases.len(), 3, "{}", text(&o));
    for case in cases {
        // No kvgeom policy models SGLang's connector.
        assert!(case["policy"].is_null(), "{case}");
    }
    let (code, files) = check(&traces);
    assert_eq!(code, Some(1), "{files:?}");
    assert_eq!(files.len(), 3, "{files:?}");
    for (case, (name, verdict, message)) in cases.iter().zip(&files) {
        let geometry = case["geometry"].as_str().expect("geometry");
        assert!(name.starts_with(geometry), "{name} vs {geometry}");
        let passed = case["passed"].as_bool().expect("passed");
        assert_eq!(verdict == "passed", passed, "{name}: {message}");
        // The first violations the sweep reported, word for word.
        for v in case["violations"]
            .as_array()
            .expect("violations")
            .iter()
            .take(10)
        {
            let v = v["message"].as_str().expect("message");
            assert!(message.contains(v), "{name}: {v} not in {message}");
        }
    }
    assert_eq!(
        files.iter().map(|f| f.1.as_str()).collect::<Vec<_>>(),
        ["passed", "violations", "violations"]
    );
    // explain --record-trace: the one case, as a plain file.
    let one = dir.join("explain.trace.json");
    let o = kvgeom(&[
        "explain",
        "--connector",
        "sglang",
        violating,
        "--prompt",
        "5",
        "--record-trace",
        one.to_str().expect("path"),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let (code, files) = check(&one);
    assert_eq!(code, Some(1), "{files:?}");
    assert_eq!(files[0].1, "violations", "{files:?}");
}
