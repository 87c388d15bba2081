//! The default sweep over `geometries/`: every case of every file passes in
//! both modes on the correct connector, and refusals happen exactly where a
//! file expects them.

use std::path::PathBuf;

use kvgeom::geometry::Mode;
use kvgeom::scenario::{Outcome, RunOptions};
use kvgeom::sweep::{execute, plan};

fn geometries() -> Vec<plan::SourcedGeometry> {
    plan::load_sources(&[PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("geometries")]).unwrap()
}

#[test]
fn every_case_of_every_geometry_passes_in_both_modes() {
    let sources = geometries();
    let cases = plan::grid(&sources, &plan::PlanOptions::default());
    assert!(cases.len() > 1000, "{} cases", cases.len());
    let reports = execute::run_all(&cases, &RunOptions::default(), None);
    let failures: Vec<String> = reports
        .iter()
        .filter(|r| !r.passed())
        .take(10)
        .map(|r| {
            format!(
                "{}: {} {:?}",
                r.case.replay_command(),
                r.outcome.describe(),
                r.violations.first()
            )
        })
        .collect();
    assert!(failures.is_empty(), "failures:\n{}", failures.join("\n"));
    // Both modes moved bytes, and every geometry that must be refused was refused.
    for mode in [Mode::Pull, Mode::Push] {
        let moved: u64 = reports
            .iter()
            .filter(|r| r.case.mode == mode)
            .map(|r| r.stats.transferred_bytes)
            .sum();
        assert!(moved > 0, "{mode} moved nothing");
    }
    for src in sources
        .iter()
        .filter(|s| s.geometry.expect_rejection.is_some())
    {
        let mine: Vec<_> = reports
            .iter()
            .filter(|r| r.case.geometry_name() == src.geometry.name)
            .collect();
        assert!(!mine.is_empty());
        assert!(
            mine.iter()
                .all(|r| matches!(r.outcome, Outcome::ExpectedRejection { .. })),
            "{} not refused as expected",
            src.geometry.name
        );
    }
}

#[test]
fn random_draws_are_reproducible_from_the_seed() {
    let sources = geometries();
    let opts = plan::PlanOptions::default();
    let a = plan::random(&sources, 40, 7, &opts);
    let b = plan::random(&sources, 40, 7, &opts);
    let key = |c: &kvgeom::scenario::Case| {
        (
            c.geometry_name().to_string(),
            c.prompt_len,
            c.prefix_hit,
            c.mode,
            c.seed,
        )
    };
    assert_eq!(
        a.iter().map(key).collect::<Vec<_>>(),
        b.iter().map(key).collect::<Vec<_>>()
    );
    let c = plan::random(&sources, 40, 8, &opts);
    assert_ne!(
        a.iter().map(key).collect::<Vec<_>>(),
        c.iter().map(key).collect::<Vec<_>>()
    );
    let reports = execute::run_all(&a, &RunOptions::default(), Some(1));
    assert!(reports.iter().all(|r| r.passed()));
}
