//! Which ranks a case touches: the prefill ranks the memory estimate
//! counts (`scenario::touched_prefill_ranks`) against the ranks whose
//! memory the case's transfers really accessed.

use std::path::PathBuf;

use kvgeom::scenario::RunOptions;
use kvgeom::sweep::plan;

/// The prefill ranks the estimate counts are exactly the ones the case's
/// transfers access: on every shipped geometry (pull, its first prompt
/// without a prefix hit), the other prefill ranks' memory is never
/// touched (their fill never runs), and every touched rank is predicted.
#[test]
fn the_ranks_the_estimate_counts_are_the_ranks_a_pull_touches() {
    use kvgeom::layout::Side;
    use kvgeom::oracle::RankMemory;
    use kvgeom::scenario::{touched_prefill_ranks, Outcome};
    use kvgeom::under_test::run_case_detailed;

    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    // The folder is searched recursively: geometries/models/ included.
    let sources =
        crate::support::vllm_stack(plan::load_sources(&[root.join("geometries")]).unwrap());
    let cases = plan::grid(
        &sources,
        &plan::PlanOptions {
            modes: vec![kvgeom::geometry::Mode::Pull],
            allocations: Some(vec![kvgeom::scheduler::DecodeAllocation::Mainline]),
            ..plan::PlanOptions::default()
        },
    );
    let mut seen = std::collections::BTreeSet::new();
    let mut with_untouched = 0;
    for case in cases.iter().filter(|c| c.prefix_hit == 0) {
        if !seen.insert(case.geometry_name().to_string()) {
            continue;
        }
        let run = run_case_detailed(case, &RunOptions::default());
        // The untouched ranks got addresses without memory, and no transfer
        // reached one (which would have run the case again with them all).
        assert!(
            !run.unbacked_accessed,
            "{}: a transfer reached a rank the estimate says none touches",
            case.geometry_name()
        );
        if run.report.outcome != Outcome::Passed {
            continue;
        }
        let input = run
            .oracle_input
            .as_ref()
            .expect("a passed case has oracle input");
        let touched: Vec<u32> = (0..case.geometry.prefill.tp_size)
            .filter(|&r| {
                matches!(
                    input.rank_memory(Side::Prefill, r),
                    Some(RankMemory::Images(_))
                )
            })
            .collect();
        let untouched = (0..case.geometry.prefill.tp_size)
            .filter(|&r| {
                matches!(
                    input.rank_memory(Side::Prefill, r),
                    Some(RankMemory::Untouched(_))
                )
            })
            .count();
        assert_eq!(
            touched.len() + untouched,
            case.geometry.prefill.tp_size as usize,
            "{}: every prefill rank is either touched or not",
            case.geometry_name()
        );
        assert_eq!(
            touched,
            touched_prefill_ranks(&case.geometry, case.mode),
            "{} N={}",
            case.geometry_name(),
            case.prompt_len
        );
        for r in 0..case.geometry.decode.tp_size {
            assert!(
                matches!(
                    input.rank_memory(Side::Decode, r),
                    Some(RankMemory::Images(_))
                ),
                "{}: decode rank {r} receives",
                case.geometry_name()
            );
        }
        with_untouched += usize::from(untouched > 0);
    }
    assert!(
        with_untouched >= 2,
        "the shipped geometries hold pairs where some prefill rank is not read ({with_untouched})"
    );
}
