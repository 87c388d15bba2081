//! vLLM's handshake compatibility hash, first of the handshake's checks: a
//! derived pair whose engines run different attention backends (or KV-cache
//! dtypes) is refused there, naming the factors; with the check turned off
//! (`--no-enforce-handshake-compat`) the same pair is judged on its geometry
//! and bytes exactly as a pair that states no backend.

use serde_json::Value;

use crate::support::{json_report, kvgeom, scratch, text};

const LLAMA: &str = "tests/fixtures/models/llama-3.1-8b-test.json";

/// `kvgeom derive` of a Llama config (one layer slot, to keep it quick), P
/// TP2 on `prefill` -> D TP1 on `decode`, written to a scratch file; `more`
/// adds options.
fn derived(name: &str, prefill: &str, decode: &str, more: &[&str]) -> String {
    let out = scratch(module_path!(), name).join(format!("{name}.toml"));
    let out = out.display().to_string();
    let mut args = vec![
        "derive",
        LLAMA,
        "--prefill-tp",
        "2",
        "--prefill-backend",
        prefill,
        "--decode-tp",
        "1",
        "--decode-backend",
        decode,
        "--layer-slots",
        "1",
        "--prompts",
        "1,17,100",
        "--out",
        &out,
    ];
    args.extend(more);
    let o = kvgeom(&args);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    out
}

/// Each case's (mode, prompt, outcome kind, message) of a sweep of `file`.
fn outcomes(file: &str) -> Vec<(String, u64, String, String)> {
    let o = kvgeom(&["sweep", file, "--alloc", "mainline", "--format", "json"]);
    let report = json_report(&o);
    report["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|c| {
            (
                c["mode"].as_str().unwrap_or_default().to_string(),
                c["prompt_len"].as_u64().unwrap_or_default(),
                c["outcome"]["kind"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                c["outcome"]["message"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            )
        })
        .collect()
}

#[test]
fn two_backends_are_refused_at_the_handshake_naming_the_factor() {
    let file = derived("two", "FLASHINFER", "FLASH_ATTN", &[]);
    let written = std::fs::read_to_string(&file).unwrap();
    assert!(written.contains("backend = \"FLASHINFER\""), "{written}");
    assert!(written.contains("backend = \"FLASH_ATTN\""), "{written}");
    let cases = outcomes(&file);
    assert!(!cases.is_empty());
    for (mode, prompt, kind, message) in &cases {
        assert_eq!(kind, "unexpected_rejection", "{mode} N={prompt}: {message}");
        assert!(
            message.starts_with(
                "NIXL compatibility hash mismatch: attn_backend_name FLASH_ATTN (decode) vs \
                 FLASHINFER (prefill)"
            ),
            "{mode} N={prompt}: {message}"
        );
    }
    // derive says so when it writes the file.
    let o = kvgeom(&[
        "derive",
        LLAMA,
        "--prefill-tp",
        "2",
        "--prefill-backend",
        "FLASHINFER",
        "--decode-tp",
        "1",
        "--decode-backend",
        "FLASH_ATTN",
    ]);
    assert!(
        text(&o).contains("note: vLLM refuses this pair at its handshake"),
        "{}",
        text(&o)
    );
    // The lifecycle does not run a pair vLLM refuses.
    let o = kvgeom(&["lifecycle", &file, "--scenarios", "2"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("vLLM refuses this pair at its handshake"),
        "{}",
        text(&o)
    );
}

#[test]
fn with_the_check_off_the_pair_is_judged_as_one_that_states_no_backend() {
    let off = derived(
        "off",
        "FLASHINFER",
        "FLASH_ATTN",
        &["--no-enforce-handshake-compat"],
    );
    let written = std::fs::read_to_string(&off).unwrap();
    assert!(
        written.contains("enforce_handshake_compat = false"),
        "{written}"
    );
    // The same file with no backend stated: one backend for both engines.
    let plain: String = written
        .lines()
        .filter(|l| {
            !l.starts_with("backend =")
                && !l.starts_with("kv_cache_dtype =")
                && !l.starts_with("enforce_handshake_compat")
        })
        .map(|l| format!("{l}\n"))
        .collect();
    let plain_file = scratch(module_path!(), "plain").join("off.toml");
    std::fs::write(&plain_file, plain).unwrap();
    let looked_past = outcomes(&off);
    assert!(looked_past
        .iter()
        .all(|(_, _, _, m)| !m.contains("compatibility hash")));
    assert_eq!(looked_past, outcomes(&plain_file.display().to_string()));
}

#[test]
fn equal_settings_pass_the_check_and_a_cache_dtype_difference_is_named() {
    let same = derived("same", "FLASHINFER", "FLASHINFER", &[]);
    assert!(outcomes(&same)
        .iter()
        .all(|(_, _, _, m)| !m.contains("compatibility hash")));
    let written = std::fs::read_to_string(&same).unwrap();
    let fp8 = written.replacen(
        "kv_cache_dtype = \"auto\"",
        "kv_cache_dtype = \"fp8_e5m2\"",
        1,
    );
    assert_ne!(fp8, written);
    let fp8_file = scratch(module_path!(), "fp8").join("same.toml");
    std::fs::write(&fp8_file, fp8).unwrap();
    let cases = outcomes(&fp8_file.display().to_string());
    assert!(!cases.is_empty());
    for (_, _, kind, message) in &cases {
        assert_eq!(kind, "unexpected_rejection");
        assert!(
            message.contains("cache_dtype auto (decode) vs fp8_e5m2 (prefill)"),
            "{message}"
        );
    }
}

/// The JSON report states the outcome of a refused case as `unexpected_rejection`
/// with the handshake's message (used above); a geometry that expects the
/// refusal passes.
#[test]
fn an_expected_compatibility_refusal_passes() {
    let file = derived(
        "expected",
        "FLASHINFER",
        "FLASH_ATTN",
        &["--expect-rejection", "NIXL compatibility hash mismatch"],
    );
    let o = kvgeom(&["sweep", &file, "--format", "json"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let report: Value = json_report(&o);
    assert_eq!(report["summary"]["failed"], 0);
}
