//! PR #30997's GDN conv slicing (and PR #22060's aggregation) through
//! kvgeom's verdict: SGLang 0.5.15.post1, the last release whose Qwen3-Next
//! config names no conv sub-blocks, against 0.5.23; and the state tensors
//! `kvgeom explain --connector sglang` lists for a hybrid file. Needs
//! `.sglang-venvs/0.5.15.post1` (`scripts/install-sglang.sh --version
//! 0.5.15.post1`) and the default `.sglang-venv`; says `skipped: <reason>`
//! without them.

use crate::support::{json_report, kvgeom, root, skip, text};

const BEFORE: &str = ".sglang-venvs/0.5.15.post1/bin/python";
const AFTER: &str = ".sglang-venv/bin/python";
const GDN: [&str; 2] = [
    "geometries/sglang/hybrid-gdn-p1-d2.toml",
    "geometries/sglang/hybrid-gdn-p2-d1.toml",
];

fn sweep(python: &str) -> (std::process::Output, serde_json::Value) {
    let mut args = vec!["sweep", "--connector", "sglang", "--sglang-python", python];
    args.extend(GDN);
    args.extend(["--prompts", "5", "--no-shrink", "--format", "json"]);
    let o = kvgeom(&args);
    let report = json_report(&o);
    (o, report)
}

/// GDN's conv row `q | k | v` sliced as one block when prefill and decode
/// run different attention TP: 0.5.15.post1 moves q channels into k's
/// places (scatter, #30997) and k's into q's (aggregation, #22060), which
/// the pairing oracle names; 0.5.23 passes both.
#[test]
fn sglang_gdn_conv_one_block_caught_on_0_5_15_post1_and_passes_on_0_5_23() {
    let test = "sglang_gdn_conv_one_block_caught_on_0_5_15_post1_and_passes_on_0_5_23";
    for p in [BEFORE, AFTER] {
        if !root().join(p).exists() {
            return skip(
                test,
                format!("no {p} (scripts/install-sglang.sh [--version 0.5.15.post1])"),
            );
        }
    }
    let (o, report) = sweep(BEFORE);
    // Exit 0: the violations are what expected/sglang-0.5.15.post1.toml lists.
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(report["code_under_test"]["version"], "0.5.15.post1");
    let cases = report["cases"].as_array().expect("cases");
    assert_eq!(cases.len(), 2, "{report}");
    for c in cases {
        assert_eq!(c["outcome"]["kind"], "violations", "{c}");
        let said = c.to_string();
        assert!(
            said.contains("[pairing]") || said.contains("\"pairing\""),
            "{said}"
        );
        assert!(said.contains("conv layer"), "{said}");
        assert!(!said.contains("temporal layer"), "{said}");
    }
    let (o, report) = sweep(AFTER);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(report["code_under_test"]["version"], "0.5.23");
    let cases = report["cases"].as_array().expect("cases");
    assert_eq!(cases.len(), 2);
    assert!(cases.iter().all(|c| c["passed"] == true), "{report}");
}

/// `explain --connector sglang` on a hybrid file lists every state tensor
/// per rank (shape, slice axis, outer count, the model channels it holds),
/// the conv sub-blocks and the request's slot; on a failing case the
/// violations name the conv channel that went wrong.
#[test]
fn sglang_explain_lists_the_state_tensors_of_a_hybrid_file() {
    let test = "sglang_explain_lists_the_state_tensors_of_a_hybrid_file";
    if !root().join(AFTER).exists() {
        return skip(test, format!("no {AFTER} (scripts/install-sglang.sh)"));
    }
    let o = kvgeom(&[
        "explain",
        "--connector",
        "sglang",
        "geometries/sglang/hybrid-gdn-p1-d2.toml",
        "--prompt",
        "5",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    for needle in [
        "state (gdn, layers [0, 1, 2]): conv sub-blocks q | k | v [8, 8, 16]",
        "prefill: attention TP 1, 5 state slots per tensor",
        "prefill-0 [0] conv layer 0: shape per slot [32, 6 B], slice axis 0 (32 channels), outer count 1, 192 B per slot; channels q 0..8, k 0..8, v 0..16",
        "decode-1 [0] conv layer 0: shape per slot [16, 6 B], slice axis 0 (16 channels), outer count 1, 96 B per slot; channels q 4..8, k 4..8, v 8..16",
        "decode-1 [3] temporal layer 0:",
        "outcome: passed",
    ] {
        assert!(out.contains(needle), "{needle}: {out}");
    }
    if !root().join(BEFORE).exists() {
        return skip(
            test,
            format!("no {BEFORE} (scripts/install-sglang.sh --version 0.5.15.post1)"),
        );
    }
    let o = kvgeom(&[
        "explain",
        "--connector",
        "sglang",
        "geometries/sglang/hybrid-gdn-p1-d2.toml",
        "--prompt",
        "5",
        "--sglang-python",
        BEFORE,
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("[pairing]") && out.contains("conv layer 0 slot 1 k 0"),
        "{out}"
    );
}
