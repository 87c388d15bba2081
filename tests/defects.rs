//! Every known connector defect is caught by the default sweep over
//! `geometries/` (the correct connector passes it: see `sweep_default.rs`).

use std::path::PathBuf;

use kvgeom::defects::Defect;
use kvgeom::scenario::RunOptions;
use kvgeom::sweep::{mutants::run_mutant, plan};

#[test]
fn the_default_sweep_catches_every_defect() {
    let sources =
        plan::load_sources(&[PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("geometries")])
            .unwrap();
    let missed: Vec<&str> = Defect::ALL
        .iter()
        .filter(|&&d| !run_mutant(&sources, d, &RunOptions::default(), None, true).caught())
        .map(|d| d.name())
        .collect();
    assert!(
        missed.is_empty(),
        "defects the sweep does not catch: {missed:?}"
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
            defect: Some(Defect::TwoPathZeroing),
            ..plan::PlanOptions::default()
        },
    );
    assert_eq!(cases.len(), 16);
    let failed = cases
        .iter()
        .filter(|c| !kvgeom::scenario::run_case(c, &RunOptions::default()).passed())
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
