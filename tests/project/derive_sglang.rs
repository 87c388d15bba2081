//! `kvgeom derive --stack sglang` against SGLang 0.5.23's own code.
//!
//! `tests/fixtures/derive/sglang-0.5.23-table.json` was produced by
//! `scripts/sglang-derive-reference.py`, which builds SGLang's
//! `ModelConfig` (with its own config classes for the hybrid families) from
//! every model config in `tests/fixtures/models/` at attention TP 1, 2, 4
//! and 8, and a `MambaPool` from the config's `mamba2_cache_params`: KV
//! heads per rank, head dims, the MLA latent, the attention and linear layer
//! ids, and each state tensor's shape, dtype, slice axis, dim per tensor,
//! outer count and conv sub-blocks. The table test derives each with kvgeom
//! and compares; the regeneration test (only where `.sglang-venv/` exists)
//! runs SGLang again and compares with the committed table.

use std::process::Command;

use serde_json::Value;

use kvgeom::derive::{
    derive_sglang_engine, derive_sglang_pair, load_sglang_model, DeriveError, SglangPairOptions,
};
use kvgeom::geometry::Stack;

use crate::support::{kvgeom, root, skip};

const TABLE: &str = "tests/fixtures/derive/sglang-0.5.23-table.json";
const MODELS: &str = "tests/fixtures/models";
const TPS: [u64; 4] = [1, 2, 4, 8];

fn table() -> Value {
    let path = root().join(TABLE);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{TABLE}: {e}"));
    serde_json::from_str(&text).expect("the table is JSON")
}

/// Differences between kvgeom's derivation of `model` at `tp` and SGLang's
/// table entry for it.
fn compare(model: &str, tp: u64, sglang: &Value) -> Vec<String> {
    let loaded = load_sglang_model(&root().join(MODELS).join(model));
    let mut problems = Vec::new();
    if let Some(why) = sglang.get("unsupported") {
        match loaded {
            Err(DeriveError::NotInSglang { .. }) => {}
            Err(e) => problems.push(format!("SGLang: {why}; kvgeom refuses otherwise: {e}")),
            Ok(_) => problems.push(format!("SGLang: {why}; kvgeom derives it")),
        }
        return problems;
    }
    let model = match loaded {
        Ok(m) => m,
        Err(e) => return vec![format!("SGLang runs it, kvgeom cannot read it: {e}")],
    };
    let derived = derive_sglang_engine(&model, tp);
    match (sglang.get("refused"), derived) {
        (Some(_), Err(DeriveError::SglangRefused { .. })) => {}
        (Some(why), other) => problems.push(format!("SGLang refuses ({why}), kvgeom: {other:?}")),
        (None, Err(e)) => problems.push(format!("SGLang builds it, kvgeom refuses: {e}")),
        (None, Ok(engine)) => {
            let ours = serde_json::to_value(&engine).expect("serializes");
            for key in ["attention", "attention_layers", "linear_layers"] {
                if ours[key] != sglang[key] {
                    problems.push(format!(
                        "{key}: SGLang {}, kvgeom {}",
                        sglang[key], ours[key]
                    ));
                }
            }
            match (sglang.get("state"), ours.get("state")) {
                (None, None) => {}
                (Some(theirs), Some(ours)) => {
                    for key in ["conv_kernel", "tensors"] {
                        if ours[key] != theirs[key] {
                            problems.push(format!(
                                "state {key}: SGLang {}, kvgeom {}",
                                theirs[key], ours[key]
                            ));
                        }
                    }
                }
                (theirs, ours) => {
                    problems.push(format!("state: SGLang {theirs:?}, kvgeom {ours:?}"))
                }
            }
        }
    }
    problems
}

fn table_problems(table: &Value) -> Vec<String> {
    let models = table["models"].as_object().expect("models");
    let mut problems = Vec::new();
    for (model, by_tp) in models {
        for tp in TPS {
            let entry = &by_tp[tp.to_string()];
            assert!(!entry.is_null(), "{model} TP{tp} is in the table");
            for p in compare(model, tp, entry) {
                problems.push(format!("{model} attention TP{tp}: {p}"));
            }
        }
    }
    problems
}

#[test]
fn derivations_match_sglang_0_5_23() {
    let table = table();
    assert_eq!(table["sglang"], "0.5.23");
    let models = table["models"].as_object().expect("models");
    for listed in [
        "llama-3.1-8b-test.json",
        "deepseek-v3.json",
        "qwen3-next-80b-a3b.json",
        "nemotron-h-8b.json",
        "falcon-h1-7b.json",
        "kimi-linear-48b-a3b.json",
        "jamba-1.5-mini.json",
        "zamba2-test.json",
    ] {
        assert!(models.contains_key(listed), "{listed} is in the table");
    }
    let problems = table_problems(&table);
    assert!(
        problems.is_empty(),
        "kvgeom differs from SGLang 0.5.23:\n{}",
        problems.join("\n")
    );
}

/// The comparison sees a change in any one of SGLang's rules: each
/// perturbation of the table (as a wrong rule in kvgeom would show) is
/// reported.
#[test]
fn the_comparison_sees_a_changed_rule() {
    let perturbations: [(&str, &str, &str, Value); 6] = [
        // KDA's conv is [K-1, channels]: three rows before the slice axis.
        (
            "kimi-linear-48b-a3b.json",
            "2",
            "/state/tensors/0/outer_count",
            1.into(),
        ),
        // GQA heads are replicated, never below one per rank.
        (
            "llama-3.1-8b-test.json",
            "8",
            "/attention/kv_heads_per_rank",
            0.into(),
        ),
        // Mamba2 groups replicated to the TP: Falcon-H1's one group at TP8.
        (
            "falcon-h1-7b.json",
            "8",
            "/state/tensors/0/dim_per_tensor",
            416.into(),
        ),
        // Qwen3-Next names its conv sub-blocks; Nemotron-H does not.
        (
            "nemotron-h-8b.json",
            "4",
            "/state/tensors/0/conv_shard_groups",
            Value::Null,
        ),
        // Kimi-Linear's kda_layers count from 1.
        (
            "kimi-linear-48b-a3b.json",
            "1",
            "/attention_layers/0",
            4.into(),
        ),
        // Jamba has no SGLang model.
        ("jamba-1.5-mini.json", "1", "", Value::Null),
    ];
    for (model, tp, pointer, value) in perturbations {
        let mut t = table();
        let entry = &mut t["models"][model][tp];
        if pointer.is_empty() {
            *entry =
                serde_json::json!({"attention": {}, "attention_layers": [], "linear_layers": []});
        } else {
            let field = entry
                .pointer_mut(pointer)
                .unwrap_or_else(|| panic!("{pointer}"));
            if *field == value {
                // Null stands for "another value" where the table holds null.
                *field = serde_json::json!([1]);
            } else {
                *field = value;
            }
        }
        let problems = compare(model, tp.parse().expect("tp"), &t["models"][model][tp]);
        assert!(!problems.is_empty(), "{model} TP{tp} {pointer}: not seen");
    }
}

#[test]
fn the_table_is_what_sglang_computes_today() {
    let python = root().join(".sglang-venv/bin/python");
    if !python.exists() {
        skip(
            "the_table_is_what_sglang_computes_today",
            "SGLang 0.5.23 is not installed in .sglang-venv/ (scripts/install-sglang.sh); \
             the committed table is checked by derivations_match_sglang_0_5_23",
        );
        return;
    }
    let out = Command::new(&python)
        .arg("scripts/sglang-derive-reference.py")
        .current_dir(root())
        .output()
        .expect("runs the reference script");
    assert!(
        out.status.success(),
        "the reference script failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let fresh: Value = serde_json::from_slice(&out.stdout).expect("the script prints JSON");
    assert!(
        fresh == table(),
        "SGLang's code no longer gives the committed table; regenerate it with \
         .sglang-venv/bin/python scripts/sglang-derive-reference.py > {TABLE}"
    );
}

/// Every model SGLang runs, every pair of TP 1/2/4/8: the file loads as an
/// SGLang geometry with the model's layers and both engines' TP.
#[test]
fn every_derived_pair_is_an_sglang_geometry() {
    let table = table();
    for (model_name, by_tp) in table["models"].as_object().expect("models") {
        if by_tp["1"].get("unsupported").is_some() {
            continue;
        }
        let model = load_sglang_model(&root().join(MODELS).join(model_name)).expect("loads");
        for p in TPS {
            for d in TPS {
                let pair = derive_sglang_pair(
                    &model,
                    &SglangPairOptions {
                        prefill_tp: p,
                        decode_tp: d,
                        page_size: 16,
                        layers: None,
                        prompts: None,
                        expect_rejection: None,
                        source: model_name.clone(),
                    },
                )
                .unwrap_or_else(|e| panic!("{model_name} P{p} D{d}: {e}"));
                let g = &pair.geometry;
                assert_eq!(g.stack, Stack::Sglang, "{model_name}");
                let s = g.sglang.as_ref().expect("SGLang fields");
                assert_eq!(
                    (s.prefill_tp_size, s.decode_tp_size),
                    (p as u32, d as u32),
                    "{model_name}"
                );
                let entry = &by_tp["1"];
                let attention = entry["attention_layers"].as_array().expect("ids");
                let linear = entry["linear_layers"].as_array().expect("ids");
                let state_layers = s.state.as_ref().map_or(0, |st| st.layers.len());
                assert_eq!(state_layers, linear.len(), "{model_name}");
                assert_eq!(
                    g.model.layer_slots as usize,
                    attention.len() + linear.len(),
                    "{model_name} P{p} D{d}: layers"
                );
            }
        }
    }
}

fn run(args: &[&str]) -> (i32, String) {
    let out = kvgeom(args);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn families_and_options_sglang_does_not_take_are_refused_by_name() {
    let cases: [(&[&str], &str); 9] = [
        (
            &[
                "tests/fixtures/models/deepseek-v3.json",
                "--tp",
                "99999999999",
            ],
            "above kvgeom's limit of 1024 ranks per engine",
        ),
        (
            &["tests/fixtures/models/llama-3.1-8b-test.json", "--tp", "3"],
            "the KV head count 8 is not divisible by the attention TP 3",
        ),
        (
            &["tests/fixtures/models/qwen3-next-80b-a3b.json", "--tp", "3"],
            "attention TP 3 is not a multiple of the KV head count 2",
        ),
        (
            &["tests/fixtures/models/jamba-1.5-mini.json", "--tp", "2"],
            "no model for model_type `jamba` (Jamba (Mamba1))",
        ),
        (
            &["tests/fixtures/models/zamba2-test.json", "--tp", "1"],
            "no model for model_type `zamba2`",
        ),
        (
            &[
                "tests/fixtures/models/llama-3.1-8b-test.json",
                "--tp",
                "2",
                "--backend",
                "FLASH_ATTN",
            ],
            "--backend is an option of vLLM's derivation",
        ),
        (
            &[
                "tests/fixtures/models/llama-3.1-8b-test.json",
                "--prefill-tp",
                "1",
                "--decode-tp",
                "2",
                "--block-size",
                "16",
            ],
            "--block-size is an option of vLLM's derivation",
        ),
        (
            &[
                "tests/fixtures/models/llama-3.1-8b-test.json",
                "--tp",
                "2",
                "--gpu",
                "sm100",
            ],
            "--gpu is an option of vLLM's derivation",
        ),
        (
            &[
                "tests/fixtures/models/llama-3.1-8b-test.json",
                "--prefill-tp",
                "1",
                "--decode-tp",
                "0",
            ],
            "--decode-tp 0",
        ),
    ];
    for (args, message) in cases {
        let mut full = vec!["derive", "--stack", "sglang"];
        full.extend_from_slice(args);
        let (code, err) = run(&full);
        assert_eq!(code, 2, "{full:?}: {err}");
        assert!(err.contains(message), "{full:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{full:?}: one line: {err}");
    }
    // And SGLang's options are not vLLM's.
    let (code, err) = run(&[
        "derive",
        "tests/fixtures/models/llama-3.1-8b-test.json",
        "--prefill-tp",
        "1",
        "--prefill-backend",
        "FLASH_ATTN",
        "--decode-tp",
        "2",
        "--decode-backend",
        "FLASH_ATTN",
        "--page-size",
        "16",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--page-size is an option of --stack sglang"),
        "{err}"
    );
}

/// One derived file, a handful of prompts, through SGLang's own transfer.
#[test]
fn a_derived_pair_sweeps_through_sglang() {
    let test = "a_derived_pair_sweeps_through_sglang";
    if kvgeom::sglang::python::find(None).is_err() {
        return skip(
            test,
            "no SGLang venv (scripts/install-sglang.sh, or KVGEOM_SGLANG_PYTHON)",
        );
    }
    let out =
        std::env::temp_dir().join(format!("kvgeom-sglang-derived-{}.toml", std::process::id()));
    let out_s = out.display().to_string();
    let (code, err) = run(&[
        "derive",
        "--stack",
        "sglang",
        "tests/fixtures/models/llama-3.1-8b-test.json",
        "--prefill-tp",
        "1",
        "--decode-tp",
        "2",
        "--page-size",
        "4",
        "--layers",
        "1",
        "--prompts",
        "5",
        "--out",
        &out_s,
    ]);
    assert_eq!(code, 0, "{err}");
    let sweep = kvgeom(&["sweep", "--connector", "sglang", &out_s]);
    let text = String::from_utf8_lossy(&sweep.stdout).into_owned();
    let _ = std::fs::remove_file(&out);
    assert_eq!(
        sweep.status.code(),
        Some(0),
        "{text}{}",
        String::from_utf8_lossy(&sweep.stderr)
    );
    assert!(text.contains("1 passed, 0 failed"), "{text}");
}
