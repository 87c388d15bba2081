//! vLLM 0.34.0's decisions on shipped geometries: pairing from the last
//! token and push's refusal of different block geometry, each held by a
//! case it gets right or wrong, and each shown to matter by running the
//! same case with 0.33.0's decision in its place.

use std::sync::Arc;

use kvgeom::connector::{NamedPolicy, Policy};
use kvgeom::geometry::{load_geometry, Mode};
use kvgeom::scenario::{Case, RunOptions};
use kvgeom::scenario::{CaseReport, Outcome};
use kvgeom::scheduler::DecodeAllocation;
use kvgeom::under_test::run_case_detailed;
use kvgeom::variant::Variant;

fn newer() -> Policy {
    NamedPolicy::from_name("vllm-0.34.0").unwrap().policy()
}

fn older() -> Policy {
    NamedPolicy::from_name("vllm-0.33.0").unwrap().policy()
}

/// One case of `geometries/NAME.toml` under `policy`.
fn run(
    name: &str,
    prompt: u32,
    mode: Mode,
    allocation: DecodeAllocation,
    policy: Policy,
) -> CaseReport {
    let path = format!("{}/geometries/{name}.toml", env!("CARGO_MANIFEST_DIR"));
    let case = Case {
        geometry: Arc::new(load_geometry(&path).unwrap()),
        file: None,
        prompt_len: prompt,
        prefix_hit: 0,
        mode,
        allocation,
        seed: 0,
        variant: Variant::KVGEOM,
    };
    let opts = RunOptions {
        policy: Some(policy),
        ..RunOptions::default()
    };
    run_case_detailed(&case, &opts).report
}

fn oracles(report: &CaseReport) -> Vec<&'static str> {
    let mut names: Vec<_> = report.violations.iter().map(|v| v.oracle).collect();
    names.sort_unstable();
    names.dedup();
    names
}

#[test]
fn last_token_pairing_fixes_the_end_trim_on_different_logical_blocks() {
    // GQA, P logical larger than D's on the same kernel: 0.33.0's end-trim
    // pairs the dead kernel blocks at the end of prefill's list.
    let name = "gqa-prefill-logical-larger";
    let fixed = run(name, 13, Mode::Pull, DecodeAllocation::Mainline, newer());
    assert!(
        fixed.passed(),
        "{:?} {:?}",
        fixed.outcome,
        fixed.violations.first()
    );
    // 0.34.0 with 0.33.0's alignment decision.
    let end_trim = Policy {
        prefix_alignment: older().prefix_alignment,
        ..newer()
    };
    let broken = run(name, 13, Mode::Pull, DecodeAllocation::Mainline, end_trim);
    assert!(
        oracles(&broken).contains(&"pairing"),
        "{:?}",
        broken.outcome
    );
}

#[test]
fn last_token_pairing_is_wrong_when_decode_holds_the_last_token_block() {
    // G1 at N = 13 (the G1 candidate): mainline pairs right, a decode list
    // one logical block longer receives prefill's tokens in its later blocks.
    let g1 = "g1-mla-kda-ppl3-vs-2";
    let mainline = run(g1, 13, Mode::Pull, DecodeAllocation::Mainline, newer());
    assert!(mainline.passed(), "{:?}", mainline.violations.first());
    let longer = run(g1, 13, Mode::Pull, DecodeAllocation::WithLastToken, newer());
    assert_eq!(
        oracles(&longer),
        ["coverage", "pairing", "transferred_or_zeroed"]
    );
    // The same case passes with kvgeom's pairing from the first token
    // (and with 0.33.0's end-trim, which this shape does not expose).
    for alignment in [Policy::default().prefix_alignment, older().prefix_alignment] {
        let other = Policy {
            prefix_alignment: alignment,
            ..newer()
        };
        let report = run(g1, 13, Mode::Pull, DecodeAllocation::WithLastToken, other);
        assert!(
            report.passed(),
            "{alignment:?}: {:?}",
            report.violations.first()
        );
    }
    // A kernel ratio too (G5: kernel 8 vs 4, ppl 3 vs 2) at N = 25.
    let g5 = "g5-mla-kda-mixed-kernel";
    assert!(run(g5, 25, Mode::Pull, DecodeAllocation::Mainline, newer()).passed());
    let longer = run(g5, 25, Mode::Pull, DecodeAllocation::WithLastToken, newer());
    assert!(oracles(&longer).contains(&"pairing"));
}

#[test]
fn push_refuses_different_block_geometry_with_vllms_reason() {
    let g1 = "g1-mla-kda-ppl3-vs-2";
    let refused = run(g1, 13, Mode::Push, DecodeAllocation::Mainline, newer());
    match &refused.outcome {
        Outcome::UnexpectedRejection { message, .. } => assert!(
            message.contains("NixlPushConnector requires identical P/D block sizes")
                && message.contains("local (4, 3), remote engine prefill (4, 2)"),
            "{message}"
        ),
        other => panic!("{other:?}"),
    }
    // 0.33.0's push accepted the pair and crashed on decode's completion.
    let accepting = Policy {
        push: older().push,
        ..newer()
    };
    let crashed = run(g1, 13, Mode::Push, DecodeAllocation::Mainline, accepting);
    assert!(
        matches!(&crashed.outcome, Outcome::Crashed { message, .. } if message.contains("IndexError")),
        "{:?}",
        crashed.outcome
    );
    // Identical block geometry still pushes (deepseek-mla: equal sizes).
    let equal = run(
        "deepseek-mla",
        64,
        Mode::Push,
        DecodeAllocation::Mainline,
        newer(),
    );
    assert!(
        !matches!(equal.outcome, Outcome::UnexpectedRejection { .. }),
        "{:?}",
        equal.outcome
    );
}
