//! Every known connector defect is caught by the default sweep over
//! `geometries/` (the correct connector passes it: see `sweep_default.rs`).

use std::collections::BTreeSet;
use std::path::PathBuf;

use kvgeom::defects::Defect;
use kvgeom::oracle::{neighbour_preservation, no_double_write, ORACLES};
use kvgeom::scenario::RunOptions;
use kvgeom::sweep::{mutants::run_mutant, plan};

#[test]
fn the_default_sweep_catches_every_defect() {
    let sources =
        plan::load_sources(&[PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("geometries")])
            .unwrap();
    // kvgeom's connector runs vLLM's stack (SGLang's files are another's).
    let sources = crate::support::vllm_stack(sources);
    let results: Vec<_> = Defect::ALL
        .iter()
        .map(|&d| run_mutant(&sources, d, &RunOptions::default(), None, true))
        .collect();
    let missed: Vec<&str> = results
        .iter()
        .filter(|r| !r.as_described())
        .map(|r| r.defect.name())
        .collect();
    assert!(
        missed.is_empty(),
        "defects the sweep does not show as their rows say: {missed:?}"
    );
    // Identical rewrites are a cost (every case right, 2x the traffic on
    // the replicated pages); different bytes to the same place are caught.
    let by = |d: Defect| results.iter().find(|r| r.defect == d).unwrap();
    let rewrites = by(Defect::PushReplicatedDoubleWrite);
    assert_eq!(
        (rewrites.failed, rewrites.multiplicity),
        (0, 2),
        "{rewrites:?}"
    );
    assert!(rewrites.redundant > 0, "{rewrites:?}");
    assert!(
        by(Defect::SplitHeadSlotIgnored)
            .oracles
            .contains(no_double_write::NAME),
        "{:?}",
        by(Defect::SplitHeadSlotIgnored)
    );
    // An oracle no known defect fails is not trusted.
    let failing: BTreeSet<&str> = results
        .iter()
        .flat_map(|r| r.oracles.iter().copied())
        .collect();
    let untested: Vec<&str> = ORACLES
        .iter()
        .map(|o| o.name)
        .filter(|name| !failing.contains(name))
        .collect();
    assert!(
        untested.is_empty(),
        "oracles that no defect variant fails: {untested:?}"
    );
    // The zeroing off-by-one touches only a neighbour: only that oracle sees it.
    let past_end = results
        .iter()
        .find(|r| r.defect == Defect::ZeroingOnePastEnd)
        .unwrap();
    assert_eq!(
        past_end.oracles.iter().copied().collect::<Vec<_>>(),
        vec![neighbour_preservation::NAME]
    );
}

#[test]
fn the_mixed_regime_two_path_zeroing_fails_11_of_16_lengths() {
    // The PR reports that the old two-path zeroing fails 11 of the 16
    // mixed-regime prompt lengths (under its test's allocation model).
    let file =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("geometries/g5-mla-kda-mixed-kernel.toml");
    let sources = plan::load_sources(&[file]).unwrap();
    let cases = plan::grid(
        &sources,
        &plan::PlanOptions {
            modes: vec![kvgeom::geometry::Mode::Pull],
            allocations: Some(vec![kvgeom::scheduler::DecodeAllocation::WithLastToken]),
            variant: kvgeom::variant::Variant::Defect(Defect::TwoPathZeroing),
            ..plan::PlanOptions::default()
        },
    );
    assert_eq!(cases.len(), 16);
    let failed = cases
        .iter()
        .filter(|c| !kvgeom::under_test::run_case(c, &RunOptions::default()).passed())
        .count();
    assert_eq!(failed, 11);
}

#[test]
fn defect_names_round_trip() {
    for d in Defect::ALL {
        assert_eq!(Defect::from_name(d.name()), Some(d));
        assert!(!d.description().is_empty() && !d.symptom().is_empty());
    }
    assert_eq!(Defect::from_name("no-such-bug"), None);
}
