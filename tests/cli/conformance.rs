//! The conformance test (`tests/support/conformance.rs`) for the
//! connectors that need no interpreter: kvgeom's own (as the twin of vLLM
//! 0.34.0, held to its expectations file) and recorded traces replayed.
//! vLLM's and SGLang's are in `tests/live/conformance.rs`.

use crate::support::conformance::{conformance, vllm_stack_cases, Connector, Lifecycle, OneCase};

/// The twin of vLLM 0.34.0: `--policy vllm-0.34.0`.
#[test]
fn kvgeoms_connector_conforms() {
    let (passing, failing) = vllm_stack_cases();
    conformance(&Connector {
        name: "kvgeom",
        options: vec!["--policy".into(), "vllm-0.34.0".into()],
        passing,
        failing,
        expectations: "expected/vllm-0.34.0.toml",
        replay: "replay: kvgeom explain",
        refused: &["--nixl", "real"],
        lifecycle: Lifecycle::Runs,
    });
}

/// vLLM 0.34.0's own runs of the same two cases, recorded.
#[test]
fn the_replay_connector_conforms() {
    let dir = "tests/fixtures/live-traces-vllm-0.34.0";
    let failing = "g1-mla-kda-ppl3-vs-2-pull-n13-hit0-with-last-token-s0.trace.json.gz";
    conformance(&Connector {
        name: "replay",
        options: Vec::new(),
        passing: OneCase::trace(
            &format!("{dir}/gqa-prefill-logical-larger-pull-n8-hit0-mainline-s0.trace.json.gz"),
            "gqa-prefill-logical-larger",
            8,
            "pull",
            "mainline",
        ),
        failing: OneCase::trace(
            &format!("{dir}/{failing}"),
            "g1-mla-kda-ppl3-vs-2",
            13,
            "pull",
            "with-last-token",
        ),
        expectations: "expected/vllm-0.34.0.toml",
        // A trace is its own minimal replay.
        replay: failing,
        refused: &["--prompts", "3"],
        lifecycle: Lifecycle::Refused("a recorded trace is one request's run"),
    });
}
