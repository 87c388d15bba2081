//! `--connector sglang --nixl real`: SGLang's NIXL KV manager on real NIXL
//! agents (host memory, UCX on loopback) reaches the same verdict, case by
//! case, as on the driver's stand-in; `--nixl real` without the nixl
//! package is exit 2 naming it. Needs the SGLang venv with NIXL
//! (`scripts/install-sglang.sh --nixl`); each test says why it is skipped.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

use crate::support::{json_report, kvgeom, kvgeom_with_env, skip, text};

/// A passing GQA file, a file SGLang 0.5.23 gets wrong
/// (expected/sglang-0.5.23.toml) and a hybrid (Mamba2) file it gets wrong.
const SAMPLE: [&str; 3] = [
    "geometries/sglang/gqa-8heads-p4-d2.toml",
    "geometries/sglang/gqa-v-head-size-p1-d2.toml",
    "geometries/sglang/hybrid-mamba2-xbc-p1-d2.toml",
];

/// The SGLang venv's interpreter, when it exists.
fn sglang_python() -> Option<PathBuf> {
    kvgeom::sglang::python::find(None).ok().map(|p| p.python)
}

/// Why real NIXL cannot be used with `python`, or `None` when it imports.
fn nixl_missing(python: &std::path::Path) -> Option<String> {
    let out = Command::new(python)
        .args(["-c", "import nixl._api"])
        .output()
        .ok()?;
    (!out.status.success()).then(|| {
        format!(
            "NIXL does not import in {} (scripts/install-sglang.sh --nixl)",
            python.display()
        )
    })
}

/// Per case (geometry, prompt): passed, the outcome's kind and the oracles
/// that found violations.
fn verdicts(report: &Value) -> Vec<(String, u64, bool, String, Vec<String>)> {
    let mut out: Vec<_> = report["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|c| {
            let mut oracles: Vec<String> = c["violations"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|v| v["oracle"].as_str().map(str::to_string))
                .collect();
            oracles.sort();
            oracles.dedup();
            (
                c["geometry"].as_str().unwrap_or_default().to_string(),
                c["prompt_len"].as_u64().unwrap_or_default(),
                c["passed"].as_bool().unwrap_or_default(),
                c["outcome"]["kind"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                oracles,
            )
        })
        .collect();
    out.sort();
    out
}

fn sweep(nixl: &str) -> Value {
    let mut args = vec![
        "sweep",
        "--connector",
        "sglang",
        "--nixl",
        nixl,
        "--prompts",
        "5,9",
        "--format",
        "json",
    ];
    args.extend(SAMPLE);
    let o = kvgeom(&args);
    // 0 (as expected/sglang-0.5.23.toml says) or 1; never a bad-input exit.
    assert!(matches!(o.status.code(), Some(0 | 1)), "{}", text(&o));
    json_report(&o)
}

#[test]
fn real_nixl_reaches_the_stand_ins_verdict_on_every_case_of_the_sample() {
    let test = "real_nixl_reaches_the_stand_ins_verdict_on_every_case_of_the_sample";
    let Some(python) = sglang_python() else {
        return skip(
            test,
            "no SGLang venv (scripts/install-sglang.sh, or KVGEOM_SGLANG_PYTHON)",
        );
    };
    if let Some(why) = nixl_missing(&python) {
        return skip(test, why);
    }
    let stand_in = sweep("stand-in");
    let real = sweep("real");
    assert_eq!(stand_in["nixl"], "stand-in");
    assert_eq!(real["nixl"], "real");
    assert!(real["nixl_version"].as_str().is_some_and(|v| !v.is_empty()));
    assert!(real["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .all(|c| c["nixl"] == "real"));
    let (s, r) = (verdicts(&stand_in), verdicts(&real));
    assert_eq!(s.len(), 6, "{s:?}");
    assert_eq!(s, r, "stand-in (left) and real NIXL (right) disagree");
    // The sample holds both verdicts, so the comparison can tell them apart.
    assert!(s.iter().any(|c| c.2) && s.iter().any(|c| !c.2), "{s:?}");
}

#[test]
fn nixl_real_without_the_nixl_package_is_exit_2_naming_it() {
    let test = "nixl_real_without_the_nixl_package_is_exit_2_naming_it";
    let Some(python) = sglang_python() else {
        return skip(
            test,
            "no SGLang venv (scripts/install-sglang.sh, or KVGEOM_SGLANG_PYTHON)",
        );
    };
    // A `nixl` package ahead of site-packages that fails to import, as an
    // interpreter without NIXL's wheels does.
    let dir = std::env::temp_dir().join(format!("kvgeom-sglang-no-nixl-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("nixl")).expect("temp dir");
    std::fs::write(
        dir.join("nixl").join("__init__.py"),
        "raise ModuleNotFoundError(\"No module named 'nixl._bindings'\")\n",
    )
    .expect("write");
    let dir_text = dir.display().to_string();
    let args = [
        "sweep",
        "--connector",
        "sglang",
        "--nixl",
        "real",
        "geometries/sglang/mha-equal-tp.toml",
    ];
    let o = kvgeom_with_env(&args, &[("PYTHONPATH", dir_text.as_str())]);
    let said = text(&o);
    assert_eq!(o.status.code(), Some(2), "{said}");
    assert!(
        said.contains(&format!("--nixl real: {}", python.display()))
            && said.contains("nixl package does not load")
            && said.contains("scripts/install-sglang.sh --nixl")
            && !said.contains("Traceback"),
        "{said}"
    );
    // `auto` falls back to the stand-in and says so.
    let o = kvgeom_with_env(
        &[
            "explain",
            "--connector",
            "sglang",
            "--nixl",
            "auto",
            "geometries/sglang/mha-equal-tp.toml",
            "--prompt",
            "5",
        ],
        &[("PYTHONPATH", dir_text.as_str())],
    );
    let said = text(&o);
    assert_eq!(o.status.code(), Some(0), "{said}");
    assert!(
        said.contains("note: --nixl auto: real NIXL does not run here"),
        "{said}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
