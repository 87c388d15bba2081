//! The live sweep's canary: one case every vLLM release the driver supports passes
//! (dense GQA, P TP1 -> D TP1 with equal 16-token blocks, HND, pull, a
//! 20-token prompt, decode allocated as mainline). A live sweep runs it first,
//! in the same driver batch as its cases; when vLLM does not pass it the
//! driver is not driving this release as it should, so no verdict of the
//! release counts: the sweep reports the release `not run: <reason>` and
//! exits 2, judging nothing else.

use std::sync::Arc;

use crate::geometry::{parse_geometry, Mode};
use crate::scenario::{Case, CaseReport};
use crate::scheduler::DecodeAllocation;
use crate::sweep::plan::{self, PlanOptions, SourcedGeometry};
use crate::variant::Variant;

/// The canary's geometry (a name no file of `geometries/` uses).
const CANARY_TOML: &str = r#"
description = "the live sweep's canary: dense GQA, equal blocks, TP1 -> TP1, HND"
prompts = [20]

[model]
layer_slots = 1
groups = ["attention"]

[model.attention]
kind = "full"
total_kv_heads = 2
head_size = 4
dtype_bytes = 2

[prefill]
tp_size = 1
kernel_block = 16
logical_block = 16
layout = "HND"

[decode]
tp_size = 1
kernel_block = 16
logical_block = 16
layout = "HND"
"#;

/// The canary's geometry name, as reports would show it.
pub const CANARY_NAME: &str = "kvgeom-canary-gqa-equal-blocks";

/// The canary case, judged as `variant` (the sweep's compared variant).
pub fn canary_case(variant: Variant) -> Case {
    let geometry = parse_geometry(CANARY_NAME, CANARY_TOML).expect("the canary geometry parses");
    let sources = [SourcedGeometry {
        geometry: Arc::new(geometry),
        file: None,
        model: None,
    }];
    let mut cases = plan::grid(
        &sources,
        &PlanOptions {
            prompts: Some(vec![20]),
            modes: vec![Mode::Pull],
            allocations: Some(vec![DecodeAllocation::Mainline]),
            variant,
            seed: 0,
        },
    );
    assert_eq!(cases.len(), 1, "one canary case");
    cases.remove(0)
}

/// Why the canary's report is not a pass (the release is then not run).
#[derive(Debug, thiserror::Error)]
#[error("the canary case ({CANARY_NAME}, N=20, pull) did not pass: {outcome}")]
pub struct CanaryFailed {
    /// The canary's outcome, as a person reads it.
    pub outcome: String,
}

/// `Err` when the canary's report is not a pass.
pub fn verdict(report: &CaseReport) -> Result<(), CanaryFailed> {
    if report.passed() {
        return Ok(());
    }
    Err(CanaryFailed {
        outcome: report.outcome.describe(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_canary_is_one_pull_case_kvgeom_passes() {
        let pinned = crate::under_test::Release::pinned().policy;
        for variant in [Variant::KVGEOM, Variant::Policy(pinned)] {
            let case = canary_case(variant);
            assert_eq!((case.mode, case.prompt_len), (Mode::Pull, 20));
            let report =
                crate::under_test::run_case(&case, &crate::scenario::RunOptions::default());
            assert!(verdict(&report).is_ok(), "{:?}", report.outcome);
        }
    }
}
