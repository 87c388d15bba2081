//! `kvgeom derive` against vLLM 0.33.0's and 0.34.0's own functions.
//!
//! `tests/fixtures/derive/vllm-0.33.0-table.json` was produced by
//! `scripts/vllm-derive-reference.py --table`, which runs vLLM 0.33.0's
//! block-size update, `select_common_block_size`, the mamba state
//! calculators and the KV-cache spec page sizes on every model config in
//! `tests/fixtures/models/` at TP 1, 2, 4, 8 on every backend of its kind,
//! without `--block-size` and with 32, 64 and 128. The table test derives
//! each case with kvgeom and compares; the regeneration test (only where
//! `scripts/install-vllm.sh --version 0.33.0` has installed `.vllm-venvs/0.33.0/`) runs vLLM again
//! and compares its output with the committed table.
//! `tests/fixtures/derive/vllm-0.34.0-table.json` is the same script run by
//! vLLM 0.34.0 (the pinned release, `.vllm-venv/`), the same cases in the same order;
//! kvgeom derives it under `--release 0.34.0`.
//!
//! `tests/fixtures/derive/vllm-0.33.0-conv-split.json` was produced the same
//! way by `scripts/vllm-conv-split-reference.py`: where vLLM 0.33.0's NIXL
//! connector puts each Mamba2 conv sub-projection when the engines' TP sizes
//! differ. The conv-split tests compare it with kvgeom's model of 0.33.0 and
//! show where kvgeom's own connector differs (replicated groups).
//! `tests/fixtures/derive/vllm-0.33.0-layer-groups.json`
//! (`scripts/vllm-layer-groups-reference.py`) is vLLM's KV-cache grouping of
//! hybrid layer counts, with the layer slots each kind reaches.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use kvgeom::derive::{
    derive_engine, load_model, Backend, CacheDtype, EngineOptions, Gpu, MambaDtype, VllmRules,
    VLLM_RULES,
};
use kvgeom::under_test::{ConnectorKind, Release, RELEASES};

use crate::support::{kvgeom, root, skip, vllm_install_command, vllm_venv_python};

const TABLE: &str = "tests/fixtures/derive/vllm-0.33.0-table.json";
const TABLE_0_34: &str = "tests/fixtures/derive/vllm-0.34.0-table.json";
const CONV_SPLIT: &str = "tests/fixtures/derive/vllm-0.33.0-conv-split.json";
const LAYER_GROUPS: &str = "tests/fixtures/derive/vllm-0.33.0-layer-groups.json";

fn load_table(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    match serde_json::from_str(&text).expect("the table is JSON") {
        Value::Array(cases) => cases,
        _ => panic!("the table is a list of cases"),
    }
}

fn options(case: &Value, rules: &'static VllmRules) -> EngineOptions {
    let s = |k: &str| case[k].as_str().unwrap_or_else(|| panic!("{k} in {case}"));
    EngineOptions {
        rules,
        tp: case["tp"].as_u64().expect("tp"),
        backend: Backend::parse(s("backend")).expect("backend"),
        gpu: Gpu::parse(s("gpu")).expect("gpu"),
        block_size: case["block_size"].as_u64(),
        cache_dtype: CacheDtype::parse(s("cache_dtype")).expect("cache dtype"),
        mamba_cache_dtype: MambaDtype::parse("mamba", s("mamba_cache_dtype")).expect("dtype"),
        mamba_ssm_cache_dtype: MambaDtype::parse("ssm", s("mamba_ssm_cache_dtype")).expect("dtype"),
    }
}

fn label(case: &Value) -> String {
    format!(
        "{} TP{} {} {} block {} cache {} mamba {} ssm {}",
        case["config"]
            .as_str()
            .unwrap_or("?")
            .rsplit('/')
            .next()
            .unwrap_or("?"),
        case["tp"],
        case["backend"].as_str().unwrap_or("?"),
        case["gpu"].as_str().unwrap_or("?"),
        case["block_size"],
        case["cache_dtype"].as_str().unwrap_or("?"),
        case["mamba_cache_dtype"].as_str().unwrap_or("?"),
        case["mamba_ssm_cache_dtype"].as_str().unwrap_or("?"),
    )
}

/// Differences between kvgeom's derivation under `rules` and vLLM's result for one case.
fn compare(case: &Value, rules: &'static VllmRules) -> Vec<String> {
    let model = load_model(&root().join(case["config"].as_str().expect("config")))
        .unwrap_or_else(|e| panic!("{}: {e}", label(case)));
    let derived = derive_engine(&model, &options(case, rules));
    let mut problems = Vec::new();
    match (case.get("refused").and_then(Value::as_str), derived) {
        (Some(reason), Err(e)) => {
            if !e.is_vllm_refusal() || !e.to_string().contains(reason) {
                problems.push(format!("vLLM refuses with `{reason}`, kvgeom with `{e}`"));
            }
        }
        (Some(reason), Ok(d)) => problems.push(format!(
            "vLLM refuses (`{reason}`), kvgeom derives {}/{}",
            d.logical_block, d.kernel_block
        )),
        (None, Err(e)) => problems.push(format!("vLLM accepts, kvgeom refuses: {e}")),
        (None, Ok(d)) => {
            let numbers = [
                ("logical_block", Some(d.logical_block)),
                ("kernel_block", Some(d.kernel_block)),
                ("ppl", Some(d.ppl)),
                (
                    "attention_bytes_per_token",
                    Some(d.attention_bytes_per_token),
                ),
                ("mamba_state_bytes", d.mamba_state_bytes),
                ("page_bytes", Some(d.page_bytes)),
            ];
            for (key, ours) in numbers {
                if case[key].as_u64() != ours {
                    problems.push(format!("{key}: vLLM {}, kvgeom {ours:?}", case[key]));
                }
            }
            if let (Some(shapes), Some(m)) = (case["mamba_shapes"].as_array(), &d.mamba) {
                // vLLM's default conv layout is (kernel - 1, channels); kvgeom
                // states it channel-first, as the NIXL connector requires.
                let conv: Vec<u64> = m.conv_shape.iter().rev().copied().collect();
                let ours = [conv, m.ssm_shape.clone()];
                let theirs: Vec<Vec<u64>> = shapes
                    .iter()
                    .map(|s| {
                        s.as_array()
                            .map_or(vec![], |a| a.iter().filter_map(Value::as_u64).collect())
                    })
                    .collect();
                if theirs != ours {
                    problems.push(format!("mamba shapes: vLLM {theirs:?}, kvgeom {ours:?}"));
                }
                let dtypes = [m.conv_dtype, m.ssm_dtype];
                let their_dtypes: Vec<&str> = case["mamba_dtypes"]
                    .as_array()
                    .map_or(vec![], |a| a.iter().filter_map(Value::as_str).collect());
                if their_dtypes != dtypes {
                    problems.push(format!(
                        "mamba dtypes: vLLM {their_dtypes:?}, kvgeom {dtypes:?}"
                    ));
                }
            } else if case["mamba_shapes"].is_array() != d.mamba.is_some() {
                problems.push("one side has mamba state, the other not".to_string());
            }
        }
    }
    problems
}

/// Every case of `table` derived under `release`'s rules: the number of
/// cases and the differences from vLLM's results.
fn table_differences(table: &str, release: &str) -> (usize, Vec<String>) {
    let rules = VllmRules::of(release).expect("kvgeom derives for the release");
    let cases = load_table(&root().join(table));
    let mut failures = Vec::new();
    let mut refused = 0;
    for case in &cases {
        refused += usize::from(case.get("refused").is_some());
        for problem in compare(case, rules) {
            failures.push(format!("{}: {problem}", label(case)));
        }
    }
    // Every family and backend is in the table, accepted and refused cases both.
    let configs: std::collections::BTreeSet<&str> =
        cases.iter().filter_map(|c| c["config"].as_str()).collect();
    let backends: std::collections::BTreeSet<&str> =
        cases.iter().filter_map(|c| c["backend"].as_str()).collect();
    assert_eq!(configs.len(), 10, "{configs:?}");
    assert_eq!(backends.len(), 7, "{backends:?}");
    assert!(cases.len() > 600 && refused > 20 && refused < cases.len() / 2);
    println!(
        "{} cases ({refused} refused by vLLM {release})",
        cases.len()
    );
    (cases.len(), failures)
}

fn assert_table_matches(table: &str, release: &str) {
    let (cases, failures) = table_differences(table, release);
    assert!(
        failures.is_empty(),
        "{} differences from vLLM {release} over {cases} cases:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn derivations_match_vllm_0_33_0() {
    assert_table_matches(TABLE, "0.33.0");
}

#[test]
fn derivations_under_release_0_34_0_match_vllm_0_34_0() {
    assert_table_matches(TABLE_0_34, "0.34.0");
}

#[test]
fn the_two_releases_derive_differently_where_their_default_block_differs() {
    // Each release's rules against the other's table: they differ exactly on
    // the cases that give no --block-size and where the default block changes
    // something, so neither table test passes with the other's rules.
    let cases = |failures: &[String]| -> std::collections::BTreeSet<String> {
        failures
            .iter()
            .map(|f| f.split(": ").next().unwrap_or_default().to_string())
            .collect()
    };
    let (_, under_0_33) = table_differences(TABLE_0_34, "0.33.0");
    let (_, under_0_34) = table_differences(TABLE, "0.34.0");
    let (under_0_33, under_0_34) = (cases(&under_0_33), cases(&under_0_34));
    assert_eq!(under_0_33.len(), 129, "{under_0_33:#?}");
    assert_eq!(under_0_33, under_0_34);
    assert!(under_0_33.iter().all(|case| case.contains(" block null ")));
}

#[test]
fn the_pinned_release_is_derives_default_and_every_vllm_release_has_rules() {
    assert_eq!(VllmRules::pinned().release, Release::pinned().version);
    for release in RELEASES
        .iter()
        .filter(|r| r.connector == ConnectorKind::Vllm)
    {
        assert!(
            VLLM_RULES.iter().any(|r| r.release == release.version),
            "vLLM {} is in the release table but kvgeom derive has no rules for it",
            release.version
        );
    }
}

fn without_key_order(v: &Value) -> String {
    // serde_json's map is ordered by key, so re-serializing normalizes.
    serde_json::to_string(v).expect("serializes")
}

/// Runs the reference script with `python` and compares its table with
/// the committed `table`.
fn regenerated_table_equals(python: &Path, table: &str) {
    let out = Command::new(python)
        .arg("scripts/vllm-derive-reference.py")
        .arg("--table")
        .current_dir(root())
        .output()
        .expect("runs the reference script");
    assert!(
        out.status.success(),
        "the reference script failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let fresh: Value = serde_json::from_slice(&out.stdout).expect("the script prints JSON");
    let committed = Value::Array(load_table(&root().join(table)));
    assert_eq!(
        without_key_order(&fresh),
        without_key_order(&committed),
        "vLLM's functions no longer give the committed table; regenerate it with \
         {} scripts/vllm-derive-reference.py --table > {table}",
        python.display()
    );
}

#[test]
fn the_table_is_what_vllm_computes_today() {
    let python = vllm_venv_python("0.33.0");
    if !python.exists() {
        skip(
            "the_table_is_what_vllm_computes_today",
            format!(
                "vLLM 0.33.0 is not installed at {} (run {}); \
                 the committed table is checked by derivations_match_vllm_0_33_0",
                python.display(),
                vllm_install_command("0.33.0")
            ),
        );
        return;
    }
    regenerated_table_equals(&python, TABLE);
}

#[test]
fn the_0_34_0_table_is_what_vllm_0_34_0_computes_today() {
    let python = vllm_venv_python("0.34.0");
    if !python.exists() {
        skip(
            "the_0_34_0_table_is_what_vllm_0_34_0_computes_today",
            format!(
                "vLLM 0.34.0 is not installed at {} (run {}); the committed table is checked by \
                 derivations_under_release_0_34_0_match_vllm_0_34_0",
                python.display(),
                vllm_install_command("0.34.0")
            ),
        );
        return;
    }
    regenerated_table_equals(&python, TABLE_0_34);
}

/// `kvgeom ARGS`: its exit status (-1 when killed), stdout and stderr.
fn kvgeom_parts(args: &[&str]) -> (i32, String, String) {
    let out = kvgeom(args);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const QWEN: &str = "tests/fixtures/models/qwen3-next-80b-a3b.json";

#[test]
fn json_output_has_the_documented_keys() {
    let (code, out, err) = kvgeom_parts(&[
        "derive",
        QWEN,
        "--tp",
        "1",
        "--backend",
        "FLASHINFER",
        "--release",
        "0.33.0",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(v["vllm_release"], "0.33.0");
    assert_eq!(v["logical_block"], 544);
    assert_eq!(v["kernel_block"], 32);
    assert_eq!(v["ppl"], 17);
    assert_eq!(v["attention_bytes_per_token"], 2048);
    assert_eq!(v["mamba_state_bytes"], 1_097_728);
    assert_eq!(v["page_bytes"], 544 * 2048);
    let (code, out, _) = kvgeom_parts(&[
        "derive",
        "tests/fixtures/models/deepseek-v3.json",
        "--tp",
        "8",
        "--backend",
        "FLASHMLA",
    ]);
    assert_eq!(code, 0);
    let v: Value = serde_json::from_str(&out).expect("JSON");
    assert!(v["mamba_state_bytes"].is_null());
    assert_eq!(v["kernel_block"], 64);
}

#[test]
fn toml_output_is_an_engine_table() {
    let (code, out, err) = kvgeom_parts(&[
        "derive",
        QWEN,
        "--tp",
        "8",
        "--backend",
        "FLASHINFER",
        "--format",
        "toml",
    ]);
    assert_eq!(code, 0, "{err}");
    let table: toml::Value = toml::from_str(&out).expect("TOML");
    // The pinned 0.34.0 starts from a block of 64: one rank's mamba state
    // (196,608 bytes at TP 8) fits 192 tokens of 1,024 bytes.
    assert_eq!(table["prefill"]["logical_block"].as_integer(), Some(192));
    assert_eq!(table["prefill"]["kernel_block"].as_integer(), Some(64));
    assert_eq!(table["prefill"]["tp_size"].as_integer(), Some(8));
}

#[test]
fn release_picks_the_rules_and_the_file_names_it() {
    // DeepSeek-V3 on FLASH_ATTN_MLA accepts any multiple of 16: the default
    // block stands, 16 under 0.33.0 and 64 under 0.34.0.
    let engine = |extra: &[&str]| {
        let mut args = vec![
            "derive",
            "tests/fixtures/models/deepseek-v3.json",
            "--tp",
            "1",
            "--backend",
            "FLASH_ATTN_MLA",
        ];
        args.extend_from_slice(extra);
        let (code, out, err) = kvgeom_parts(&args);
        assert_eq!(code, 0, "{err}");
        serde_json::from_str::<Value>(&out).expect("JSON")
    };
    let pinned = engine(&[]);
    assert_eq!(pinned["vllm_release"], "0.34.0");
    assert_eq!(pinned["logical_block"], 64);
    assert_eq!(pinned["kernel_block"], 64);
    assert_eq!(engine(&["--release", "0.34.0"]), pinned);
    let older = engine(&["--release", "0.33.0"]);
    assert_eq!(older["vllm_release"], "0.33.0");
    assert_eq!(older["logical_block"], 16);

    // The pair's geometry file and the engine table say whose rules applied.
    let (code, out, err) = kvgeom_parts(&[
        "derive",
        QWEN,
        "--release",
        "0.34.0",
        "--prefill-tp",
        "2",
        "--prefill-backend",
        "FLASHINFER",
        "--decode-tp",
        "2",
        "--decode-backend",
        "FLASHINFER",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("as vLLM 0.34.0 runs it:"), "{out}");
    let (code, out, err) = kvgeom_parts(&[
        "derive",
        QWEN,
        "--tp",
        "2",
        "--backend",
        "FLASHINFER",
        "--format",
        "toml",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("as vLLM 0.34.0 runs it"), "{out}");

    // An unknown release names the known ones; SGLang takes no --release.
    let (code, _, err) = kvgeom_parts(&[
        "derive",
        QWEN,
        "--tp",
        "1",
        "--backend",
        "FLASH_ATTN",
        "--release",
        "0.32.0",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--release 0.32.0: kvgeom derive knows the block-size rules of vLLM 0.33.0, 0.34.0 only"),
        "{err}"
    );
    let (code, _, err) = kvgeom_parts(&[
        "derive",
        QWEN,
        "--stack",
        "sglang",
        "--tp",
        "1",
        "--release",
        "0.34.0",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains(
            "--release is an option of vLLM's derivation; --stack sglang does not take it"
        ),
        "{err}"
    );
    // A refusal names the release whose rules refused.
    let (code, _, err) = kvgeom_parts(&[
        "derive",
        QWEN,
        "--tp",
        "3",
        "--backend",
        "FLASH_ATTN",
        "--release",
        "0.34.0",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("vLLM 0.34.0 refuses this deployment"), "{err}");
}

fn temp_file(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kvgeom-derive-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write");
    path
}

#[test]
fn bad_input_exits_2_naming_the_problem() {
    let cases: [(&str, &str, &[&str], &str); 5] = [
        ("malformed.json", "{\"model_type\": ", &[], "not a JSON model config"),
        ("no-type.json", "{\"hidden_size\": 4}", &[], "has no `model_type`"),
        (
            "unknown.json",
            "{\"model_type\": \"gpt2\"}",
            &[],
            "unknown model_type `gpt2`; supported model types: qwen3_next",
        ),
        (
            "missing.json",
            "{\"model_type\": \"qwen3_next\", \"num_hidden_layers\": 4, \"num_attention_heads\": 4, \"head_dim\": 8}",
            &[],
            "`linear_num_key_heads` is missing",
        ),
        (
            "string-heads.json",
            "{\"model_type\": \"llama\", \"num_hidden_layers\": 2, \"num_attention_heads\": \"many\"}",
            &[],
            "`num_attention_heads` must be a positive integer, found \"many\"",
        ),
    ];
    for (name, text, extra, expected) in cases {
        let path = temp_file(name, text);
        let path = path.to_str().expect("utf-8");
        let mut args = vec!["derive", path, "--tp", "1", "--backend", "FLASH_ATTN"];
        args.extend_from_slice(extra);
        let (code, _, err) = kvgeom_parts(&args);
        assert_eq!(code, 2, "{name}: {err}");
        assert!(err.contains(expected), "{name}: {err}");
    }
    let (code, _, err) = kvgeom_parts(&["derive", QWEN, "--tp", "1", "--backend", "XFORMERS"]);
    assert_eq!(code, 2);
    assert!(
        err.contains(
            "unknown attention backend `XFORMERS`; supported backends: FLASH_ATTN, FLASHINFER"
        ),
        "{err}"
    );
    let (code, _, err) = kvgeom_parts(&["derive", QWEN, "--tp", "3", "--backend", "FLASH_ATTN"]);
    assert_eq!(code, 2);
    assert!(
        err.contains(
            "Total number of attention heads (16) must be divisible by tensor parallel size (3)"
        ),
        "{err}"
    );
    let (code, _, err) = kvgeom_parts(&[
        "derive",
        "tests/fixtures/models/kimi-linear-48b-a3b.json",
        "--tp",
        "2",
        "--backend",
        "FLASHMLA",
        "--cache-dtype",
        "fp8",
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("fp8 KV cache on an MLA model"), "{err}");
    let (code, _, err) = kvgeom_parts(&[
        "derive",
        "no/such/config.json",
        "--tp",
        "1",
        "--backend",
        "FLASH_ATTN",
    ]);
    assert_eq!(code, 2);
    assert!(
        err.contains("no/such/config.json: cannot read the model config"),
        "{err}"
    );
}

/// A geometry file naming Qwen3-Next's config, P TP8 -> D TP2 on
/// FlashInfer, derived under vLLM 0.33.0's rules (`model.vllm_release`).
fn derived_file(engine_extra: &str) -> String {
    format!(
        "description = \"Qwen3-Next from its config\"\nprompts = [2, 145]\n\n[model]\n\
         hf_config = \"{}\"\nlayer_slots = 2\nvllm_release = \"0.33.0\"\n\n[prefill]\ntp_size = 8\nbackend = \"FLASHINFER\"\n{engine_extra}\n\
         [decode]\ntp_size = 2\nbackend = \"FLASHINFER\"\n",
        root().join(QWEN).display()
    )
}

#[test]
fn a_geometry_file_may_name_the_model_config() {
    let path = temp_file("from-config.toml", &derived_file(""));
    let g = kvgeom::derive::load_geometry_file(&path).expect("loads");
    assert_eq!((g.prefill.logical_block, g.prefill.kernel_block), (144, 16));
    assert_eq!((g.decode.logical_block, g.decode.kernel_block), (544, 32));
    assert_eq!(g.model.layer_slots, 2);
    assert_eq!(g.prompts, Some(vec![2, 145]));
    // Stating the blocks vLLM uses is allowed.
    let path = temp_file(
        "from-config-stated.toml",
        &derived_file("logical_block = 144\nkernel_block = 16\n"),
    );
    assert!(kvgeom::derive::load_geometry_file(&path).is_ok());
    // Without model.vllm_release the pinned 0.34.0's rules apply.
    let path = temp_file(
        "from-config-pinned.toml",
        &derived_file("").replace("vllm_release = \"0.33.0\"\n", ""),
    );
    let g = kvgeom::derive::load_geometry_file(&path).expect("loads");
    assert_eq!((g.prefill.logical_block, g.prefill.kernel_block), (192, 64));
    assert_eq!((g.decode.logical_block, g.decode.kernel_block), (576, 64));
    // A release kvgeom does not derive for, or not a string: named.
    for (value, wanted) in [
        (
            "\"0.32.0\"",
            "model.vllm_release: kvgeom derives for vLLM 0.33.0, 0.34.0, not 0.32.0",
        ),
        ("34", "model.vllm_release: must be a release string"),
    ] {
        let path = temp_file(
            "from-config-bad-release.toml",
            &derived_file("").replace("\"0.33.0\"", value),
        );
        let err = kvgeom::derive::load_geometry_file(&path)
            .unwrap_err()
            .to_string();
        assert!(err.contains(wanted), "{err}");
    }
}

#[test]
fn blocks_vllm_would_not_produce_are_refused() {
    let path = temp_file(
        "impossible-logical.toml",
        &derived_file("logical_block = 550\nkernel_block = 50\n"),
    );
    let err = kvgeom::derive::load_geometry_file(&path)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("prefill.logical_block: 550 is not what vLLM 0.33.0 would use")
            && err.contains("144 tokens"),
        "{err}"
    );
    let path = temp_file(
        "impossible-kernel.toml",
        &derived_file("logical_block = 144\nkernel_block = 48\n"),
    );
    let err = kvgeom::derive::load_geometry_file(&path)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("prefill.kernel_block: 48 is not what vLLM 0.33.0 would use")
            && err.contains("select_common_block_size: 16 for logical block 144"),
        "{err}"
    );
    let path = temp_file(
        "no-backend.toml",
        &derived_file("").replace("backend = \"FLASHINFER\"\n\n[decode]", "\n[decode]"),
    );
    let err = kvgeom::derive::load_geometry_file(&path)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(
            "prefill.backend: a file with model.hf_config names each engine's attention backend"
        ),
        "{err}"
    );
}

#[test]
fn a_pair_file_loads_and_says_how_it_was_derived() {
    let out = std::env::temp_dir().join(format!("kvgeom-derive-pair-{}.toml", std::process::id()));
    let (code, _, err) = kvgeom_parts(&[
        "derive",
        QWEN,
        "--prefill-tp",
        "2",
        "--prefill-backend",
        "FLASHINFER",
        "--decode-tp",
        "4",
        "--decode-backend",
        "FLASHINFER",
        "--block-size",
        "64",
        "--layer-slots",
        "2",
        "--prompts",
        "boundaries",
        "--out",
        out.to_str().expect("utf-8"),
    ]);
    assert_eq!(code, 0, "{err}");
    let text = std::fs::read_to_string(&out).expect("written");
    assert!(text.starts_with("# Derived by `kvgeom derive"), "{text}");
    let g = kvgeom::derive::load_geometry_file(&out).expect("loads");
    assert_eq!((g.prefill.logical_block, g.prefill.kernel_block), (576, 64));
    assert_eq!((g.decode.logical_block, g.decode.kernel_block), (320, 64));
    let prompts = g.prompts.expect("boundaries");
    for n in [63, 64, 65, 319, 320, 321, 575, 576, 577] {
        assert!(prompts.contains(&n), "{n} in {prompts:?}");
    }
    // Mamba2 groups replicated on one engine only (Falcon-H1: one group,
    // 3584 conv channels per rank at TP1, 2048 at TP2): the file states
    // n_groups and the model's channels, each engine's widths follow.
    let out =
        std::env::temp_dir().join(format!("kvgeom-derive-falcon-{}.toml", std::process::id()));
    let (code, _, err) = kvgeom_parts(&[
        "derive",
        "tests/fixtures/models/falcon-h1-7b.json",
        "--prefill-tp",
        "1",
        "--prefill-backend",
        "FLASH_ATTN",
        "--decode-tp",
        "2",
        "--decode-backend",
        "FLASH_ATTN",
        "--out",
        out.to_str().expect("utf-8"),
    ]);
    assert_eq!(code, 0, "{err}");
    let g = kvgeom::derive::load_geometry_file(&out).expect("loads");
    let m = g.model.mamba.expect("Mamba2");
    assert_eq!(
        (m.conv_dims.clone(), m.n_groups),
        (vec![3072, 256, 256], Some(1))
    );
    let channels = |tp| (0..3).map(|j| m.rank_channels(j, tp)).sum::<u32>();
    assert_eq!((channels(1), channels(2), channels(4)), (3584, 2048, 1280));
}

#[test]
fn derived_pairs_sweep_green_or_refused_where_vllm_refuses() {
    // D's FlashInfer kernel drops to 16 at TP4 while P's is 32: refused.
    let (code, out, err) = kvgeom_parts(&[
        "sweep",
        "geometries/models/reject-qwen3-next-p2-d4-flashinfer.toml",
        "--prompts",
        "2,545",
        "--format",
        "json",
    ]);
    assert_eq!(code, 0, "{out}{err}");
    let report: Value = serde_json::from_str(&out).expect("JSON report");
    let cases = report["cases"].as_array().expect("cases");
    assert!(!cases.is_empty());
    assert!(cases
        .iter()
        .all(|c| c["outcome"]["kind"] == "expected_rejection"));
    // With --block-size 64 both kernels are 64: accepted, every byte checked.
    let (code, out, err) = kvgeom_parts(&[
        "sweep",
        "geometries/models/qwen3-next-p2-d4-flashinfer-block-size-64.toml",
        "--prompts",
        "2,321",
        "--format",
        "json",
    ]);
    assert_eq!(code, 0, "{out}{err}");
    let report: Value = serde_json::from_str(&out).expect("JSON report");
    assert_eq!(report["summary"]["failed"], 0);
    assert!(report["summary"]["passed"].as_u64() > Some(0));
}

/// `kvgeom sweep FILE --prompts N --alloc mainline ARGS --format json`: each
/// case's mode and outcome kind.
fn sweep_outcomes(file: &str, prompt: &str, args: &[&str]) -> Vec<(String, String)> {
    let base = [
        "sweep",
        file,
        "--prompts",
        prompt,
        "--alloc",
        "mainline",
        "--format",
        "json",
    ];
    let (_, out, err) = kvgeom_parts(&[&base[..], args].concat());
    let report: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}{err}"));
    report["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|c| {
            (
                c["mode"].as_str().unwrap().to_string(),
                c["outcome"]["kind"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn falcon_h1_with_replicated_groups_transfers_right_where_vllm_reads_wrong_bytes() {
    // P TP4 -> D TP2: 1280 conv channels per prefill rank, 2048 per decode rank.
    let file = "geometries/models/falcon-h1-p4-flashinfer-d2-flashinfer.toml";
    let g = kvgeom::derive::load_geometry_file(root().join(file)).expect("loads");
    assert_eq!(g.model.mamba.as_ref().and_then(|m| m.n_groups), Some(1));
    let ours = sweep_outcomes(file, "785", &["--mode", "pull"]);
    assert_eq!(ours, [("pull".to_string(), "passed".to_string())]);
    let vllm = sweep_outcomes(file, "785", &["--mode", "pull", "--policy", "vllm-0.33.0"]);
    assert_eq!(vllm, [("pull".to_string(), "violations".to_string())]);
}

#[test]
fn a_pair_refused_in_push_only_says_so_per_mode() {
    // Kimi-Linear P TP1 1920/1920 -> D TP2 1024/1024 (FLASH_ATTN_MLA): pull
    // splits the larger prefill blocks; push cannot pair them.
    let file = "geometries/models/kimi-linear-p1-d2-flash-attn-mla-push-refused.toml";
    let g = kvgeom::derive::load_geometry_file(root().join(file)).expect("loads");
    let expected = g.expect_rejection.expect("a per-mode rejection");
    assert_eq!(expected.pull, None);
    assert_eq!(
        expected.push.as_deref(),
        Some("is not divisible by remote block size")
    );
    let mut outcomes = sweep_outcomes(file, "2", &[]);
    outcomes.sort();
    assert_eq!(
        outcomes,
        [
            ("pull".to_string(), "passed".to_string()),
            ("push".to_string(), "expected_rejection".to_string())
        ]
    );
}

// ---------------------------------------------------------------- conv split

/// The model's mamba table as `derive` writes it for a pair of these TP sizes.
fn derived_mamba(config: &str, local_tp: u64, remote_tp: u64) -> kvgeom::geometry::MambaSpec {
    let model = load_model(&root().join(config)).expect("loads");
    let pair = kvgeom::derive::derive_pair(
        &model,
        &kvgeom::derive::PairOptions {
            prefill: EngineOptions::new(remote_tp, Backend::parse("FLASH_ATTN").unwrap()),
            decode: EngineOptions::new(local_tp, Backend::parse("FLASH_ATTN").unwrap()),
            layer_slots: Some(1),
            enforce_handshake_compat: true,
        },
    )
    .unwrap_or_else(|e| panic!("{config} TP{local_tp} / TP{remote_tp}: {e}"));
    pair.geometry.model.mamba.expect("a mamba model")
}

fn pairs_of(v: &Value) -> Vec<(u64, u64)> {
    v.as_array()
        .expect("a list of [offset, length]")
        .iter()
        .map(|r| (r[0].as_u64().unwrap(), r[1].as_u64().unwrap()))
        .collect()
}

fn regions(subs: &[kvgeom::geometry::SubRegion]) -> Vec<(u64, u64)> {
    subs.iter().map(|s| (s.offset, s.size)).collect()
}

#[test]
fn conv_split_of_vllm_0_33_0_is_what_vllm_computes() {
    use kvgeom::internals::conv_split::{remote_conv_offsets, ConvPeer, ConvSplit, RankAt};
    let table = load_table(&root().join(CONV_SPLIT));
    assert!(table.len() >= 9);
    let mut replicated_pairs = 0;
    for pair in &table {
        let config = pair["config"].as_str().unwrap();
        let (local_tp, remote_tp) = (
            pair["local_tp"].as_u64().unwrap() as u32,
            pair["remote_tp"].as_u64().unwrap() as u32,
        );
        let t = pair["tp_ratio"].as_i64().unwrap() as i32;
        let what = format!("{config} local TP{local_tp} <-> remote TP{remote_tp}");
        let spec = derived_mamba(config, local_tp.into(), remote_tp.into());
        // Each engine's widths, from derive's file: vLLM's conv decomposition.
        for (key, tp) in [("local_channels", local_tp), ("remote_channels", remote_tp)] {
            let widths: Vec<u64> = (0..3).map(|j| spec.rank_channels(j, tp).into()).collect();
            let vllm: Vec<u64> = pair[key]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c.as_u64().unwrap())
                .collect();
            assert_eq!(widths, vllm, "{what}: {key}");
        }
        let (local_conv, local_ssm) = spec.ssm_sizes(local_tp);
        let (remote_conv, remote_ssm) = spec.ssm_sizes(remote_tp);
        let sizes = |key: &str| -> Vec<u64> {
            pair[key]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c.as_u64().unwrap())
                .collect()
        };
        assert_eq!(sizes("local_ssm_sizes"), [local_conv, local_ssm], "{what}");
        assert_eq!(
            sizes("remote_ssm_sizes"),
            [remote_conv, remote_ssm],
            "{what}"
        );
        let replicated =
            (1..3).any(|j| spec.is_replicated(j, local_tp) || spec.is_replicated(j, remote_tp));
        let mut differs = false;
        for rank in pair["ranks"].as_array().unwrap() {
            let r = rank["rank"].as_u64().unwrap() as u32;
            let sources: Vec<u32> = rank["sources"]
                .as_array()
                .unwrap()
                .iter()
                .map(|s| s.as_u64().unwrap() as u32)
                .collect();
            let remote = pairs_of(&rank["remote"]);
            for (position, &source) in sources.iter().enumerate() {
                let peer = ConvPeer {
                    local: RankAt {
                        tp_size: local_tp,
                        tp_rank: r,
                    },
                    peer: RankAt {
                        tp_size: remote_tp,
                        tp_rank: source,
                    },
                    local_is_destination: true,
                    position: position as u32,
                    ranks: sources.len() as u32,
                };
                let scaled = remote_conv_offsets(ConvSplit::LocalWidthsScaled, &spec, &peer, t);
                assert_eq!(
                    regions(&scaled),
                    remote[..3],
                    "{what} rank {r}: remote conv pieces"
                );
                let own = remote_conv_offsets(ConvSplit::PeerWidths, &spec, &peer, t);
                differs |= regions(&own) != remote[..3];
                // The SSM state: this rank's slice of a larger remote state,
                // or the whole of a smaller one.
                let read = if t >= 1 { local_ssm } else { remote_ssm };
                let slice = if t >= 1 { u64::from(r % t as u32) } else { 0 };
                assert_eq!(
                    remote[3],
                    (remote_conv + slice * read, read),
                    "{what} rank {r}: SSM"
                );
                // The local pieces: with several sources, each source's even
                // share of every local sub-region (kvgeom's split lists).
                let local = pairs_of(&rank["local"][position]);
                let n = sources.len() as u64;
                let mut own_local: Vec<(u64, u64)> = spec
                    .conv_offsets(local_tp)
                    .iter()
                    .map(|s| (s.offset + position as u64 * s.size / n, s.size / n))
                    .collect();
                own_local.push((local_conv + position as u64 * local_ssm / n, local_ssm / n));
                assert_eq!(
                    local, own_local,
                    "{what} rank {r} source {source}: local pieces"
                );
            }
        }
        // kvgeom's own connector reads what vLLM reads exactly where every
        // sub-projection is sharded on both engines.
        let mismatched = replicated && local_tp != remote_tp;
        assert_eq!(differs, mismatched, "{what}");
        replicated_pairs += usize::from(mismatched);
    }
    assert!(replicated_pairs >= 4, "{replicated_pairs}");
}

#[test]
fn the_conv_split_table_is_what_vllm_computes_today() {
    let python = vllm_venv_python("0.33.0");
    if !python.exists() {
        skip(
            "the_conv_split_table_is_what_vllm_computes_today",
            format!(
                "vLLM 0.33.0 is not installed at {} (run {}); \
                 the committed conv-split table is checked by conv_split_of_vllm_0_33_0_is_what_vllm_computes",
                python.display(),
                vllm_install_command("0.33.0")
            ),
        );
        return;
    }
    let out = Command::new(&python)
        .arg("scripts/vllm-conv-split-reference.py")
        .current_dir(root())
        .output()
        .expect("runs the reference script");
    assert!(
        out.status.success(),
        "the conv-split script failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let fresh: Value = serde_json::from_slice(&out.stdout).expect("the script prints JSON");
    let committed = Value::Array(load_table(&root().join(CONV_SPLIT)));
    assert_eq!(
        without_key_order(&fresh),
        without_key_order(&committed),
        "vLLM's functions no longer give the committed conv-split table; regenerate it with \
         {} scripts/vllm-conv-split-reference.py > {CONV_SPLIT}",
        python.display()
    );
}

// ---------------------------------------------------------------- layer groups

#[test]
fn layer_groups_are_vllms() {
    use kvgeom::derive::layer_groups_of;
    use kvgeom::geometry::GroupKind;
    let table = load_table(&root().join(LAYER_GROUPS));
    let mut rows = Vec::new();
    for row in &table {
        let n = |k: &str| row[k].as_u64().unwrap();
        let (a, m, first) = (
            n("attention_layers"),
            n("mamba_layers"),
            row["mamba_first"].as_bool().unwrap(),
        );
        let g = layer_groups_of(a, m, first);
        let what = format!("{a} attention + {m} mamba layers");
        let vllm: Vec<(String, u64)> = row["groups"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| {
                (
                    g["kind"].as_str().unwrap().to_string(),
                    g["layers"].as_u64().unwrap(),
                )
            })
            .collect();
        let ours: Vec<(String, u64)> = g
            .groups
            .iter()
            .zip(&g.layers_per_group)
            .map(|(k, n)| {
                let kind = if *k == GroupKind::Attention {
                    "attention"
                } else {
                    "mamba"
                };
                (kind.to_string(), *n)
            })
            .collect();
        assert_eq!(ours, vllm, "{what}");
        assert_eq!(g.group_size, n("slots"), "{what}");
        assert_eq!(
            g.slots_of(GroupKind::Attention),
            n("attention_slots"),
            "{what}"
        );
        assert_eq!(g.slots_of(GroupKind::Mamba), n("mamba_slots"), "{what}");
        rows.push((a, m, first));
    }
    // Every hybrid config in tests/fixtures/models/ is a row, and in each of
    // them every layer slot holds a layer of both kinds (partly filled groups
    // included: Kimi-Linear's 20 KDA layers in 7, 7, 6): their transfers are
    // those of full groups.
    let mut hybrids = 0;
    for entry in std::fs::read_dir(root().join("tests/fixtures/models")).unwrap() {
        let model = load_model(&entry.unwrap().path()).expect("loads");
        if model.mamba.is_none() {
            continue;
        }
        hybrids += 1;
        let key = (
            model.attention_layers,
            model.mamba_layers,
            model.mamba_first,
        );
        assert!(rows.contains(&key), "{key:?} not in {LAYER_GROUPS}");
        let g = kvgeom::derive::layer_groups(&model);
        assert_eq!(g.slots_of(GroupKind::Mamba), g.group_size, "{key:?}");
        assert_eq!(g.slots_of(GroupKind::Attention), g.group_size, "{key:?}");
    }
    assert_eq!(hybrids, 8);
    // Where the mamba layers reach fewer slots (15 in groups of 7: three of
    // 5), vLLM registers state only in the slots that hold it.
    assert!(table
        .iter()
        .any(|r| r["mamba_slots"].as_u64() < r["slots"].as_u64()));
}

#[test]
fn the_layer_groups_table_is_what_vllm_computes_today() {
    let python = vllm_venv_python("0.33.0");
    if !python.exists() {
        skip(
            "the_layer_groups_table_is_what_vllm_computes_today",
            format!(
                "vLLM 0.33.0 is not installed at {} (run {}); \
                 the committed layer-groups table is checked by layer_groups_are_vllms",
                python.display(),
                vllm_install_command("0.33.0")
            ),
        );
        return;
    }
    let out = Command::new(&python)
        .arg("scripts/vllm-layer-groups-reference.py")
        .current_dir(root())
        .output()
        .expect("runs the reference script");
    assert!(
        out.status.success(),
        "the layer-groups script failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let fresh: Value = serde_json::from_slice(&out.stdout).expect("the script prints JSON");
    let committed = Value::Array(load_table(&root().join(LAYER_GROUPS)));
    assert_eq!(
        without_key_order(&fresh),
        without_key_order(&committed),
        "vLLM's grouping no longer gives the committed table; regenerate it with \
         {} scripts/vllm-layer-groups-reference.py > {LAYER_GROUPS}",
        python.display()
    );
}

#[test]
fn slots_without_a_mamba_layer_hold_no_state() {
    // Kimi-Linear cut to 22 layers: 7 MLA and 15 KDA, so vLLM's KDA groups
    // hold 5 layers each and slots 5 and 6 have no KDA layer.
    let mut config: Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("tests/fixtures/models/kimi-linear-48b-a3b.json"))
            .unwrap(),
    )
    .unwrap();
    let full = [4, 8, 12, 16, 20, 21, 22];
    config["num_hidden_layers"] = 22.into();
    config["linear_attn_config"]["full_attn_layers"] = full.to_vec().into();
    config["linear_attn_config"]["kda_layers"] = (1..=22)
        .filter(|l| !full.contains(l))
        .collect::<Vec<u32>>()
        .into();
    let path = temp_file("kimi-22.json", &config.to_string());
    let path = path.to_str().unwrap();
    let pair = [
        "derive",
        path,
        "--prefill-tp",
        "2",
        "--prefill-backend",
        "FLASHMLA",
        "--decode-tp",
        "2",
        "--decode-backend",
        "FLASHMLA",
    ];
    let (code, out, err) = kvgeom_parts(&pair);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(
            "7 attention + 15 mamba layers in groups of 7 (a mamba layer in the first 5 slots only"
        ),
        "{out}"
    );
    assert!(out.contains("layer_slots = 7\nstate_slots = 5\n"), "{out}");
    // The file loads as written, with state in the first 5 slots only, and
    // every oracle passes on it.
    let file = temp_file("kimi-22-pair.toml", &out);
    let g = kvgeom::geometry::load_geometry(&file).expect("the derived file loads");
    assert_eq!((g.model.layer_slots, g.model.state_slot_count()), (7, 5));
    let outcomes = sweep_outcomes(file.to_str().unwrap(), "1..=3", &["--mode", "pull"]);
    assert!(!outcomes.is_empty());
    assert!(
        outcomes.iter().all(|(_, kind)| kind == "passed"),
        "{outcomes:?}"
    );
    // Fewer slots than the mamba layers reach: every modelled slot holds state.
    let (code, out, err) = kvgeom_parts(&[&pair[..], &["--layer-slots", "3"]].concat());
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("layer_slots = 3\n") && !out.contains("state_slots"),
        "{out}"
    );
    let (code, out, err) = kvgeom_parts(&[&pair[..], &["--layer-slots", "6"]].concat());
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("layer_slots = 6\nstate_slots = 5\n"), "{out}");
    let (code, _, err) = kvgeom_parts(&[&pair[..], &["--layer-slots", "8"]].concat());
    assert_eq!(code, 2);
    assert!(
        err.contains("--layer-slots 8: vLLM 0.33.0 gives this model 7 layer slots (7 attention + 15 mamba layers in groups of 7); at most 7 can be modelled"),
        "{err}"
    );
}
