//! `--policy vllm-0.33.0` over `geometries/` (with `geometries/models/`)
//! fails exactly where `expected/vllm-0.33.0.toml` says vLLM 0.33.0 is wrong
//! (each entry citing its page of docs/findings/), and the default policy
//! fails nowhere the file lists.

use crate::default_sweep;

use kvgeom::connector::NamedPolicy;
use kvgeom::scenario::RunOptions;
use kvgeom::sweep::{execute, plan};
use kvgeom::under_test::expectations::Expectations;
use kvgeom::variant::Variant;

use crate::support::root;

fn expectations() -> Expectations {
    Expectations::load(&root().join("expected/vllm-0.33.0.toml")).unwrap()
}

#[test]
fn vllm_0_33_0_fails_exactly_where_the_findings_say() {
    // geometries/ and, at one prompt each, the derived pairs below it (the
    // release sweep of .ci/run checks their full lists against the file).
    let cases = default_sweep::default_grid(Variant::Policy(NamedPolicy::Vllm0330));
    let reports = execute::run_all(&cases, &RunOptions::default(), None);
    let expected = expectations();
    let disagreements = expected.compare(&reports);
    assert!(
        disagreements.is_empty(),
        "{} disagreements, first:\n{}",
        disagreements.len(),
        disagreements[..disagreements.len().min(10)].join("\n")
    );
    // Over the full sweep, an entry that covers nothing is stale.
    assert_eq!(expected.unused(&reports), Vec::<String>::new());
}

#[test]
fn the_twin_of_vllm_0_34_0_fails_exactly_where_its_expectations_say() {
    // `expected/vllm-0.34.0.toml` is `--policy vllm-0.34.0`'s own run (the
    // twin's prediction until the driver runs 0.34.0): it must hold, and
    // kvgeom's own connector must fail none of its cases.
    let newer = NamedPolicy::from_name("vllm-0.34.0").unwrap();
    let expected = Expectations::load(&root().join("expected/vllm-0.34.0.toml")).unwrap();
    let cases = default_sweep::default_grid(Variant::Policy(newer));
    let reports = execute::run_all(&cases, &RunOptions::default(), None);
    let disagreements = expected.compare(&reports);
    assert!(
        disagreements.is_empty(),
        "{} disagreements, first:\n{}",
        disagreements.len(),
        disagreements[..disagreements.len().min(10)].join("\n")
    );
    // The derived pairs run one sample prompt here: only their entries may
    // cover none of it (`kvgeom sweep --policy vllm-0.34.0 --expect ...`
    // runs their boundary prompts too).
    let models: Vec<String> = std::fs::read_dir(root().join("geometries/models"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter_map(|path| Some(path.file_stem()?.to_str()?.to_string()))
        .collect();
    let stale: Vec<String> = expected
        .unused(&reports)
        .into_iter()
        .filter(|entry| !models.iter().any(|m| entry.contains(&format!("({m} "))))
        .collect();
    assert_eq!(stale, Vec::<String>::new());
}

#[test]
fn every_expected_failure_cites_an_existing_finding() {
    // Every expectations file of expected/ (vLLM's and SGLang's releases):
    // each entry's page exists and names the geometry it explains.
    let mut files: Vec<_> = std::fs::read_dir(root().join("expected"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "toml"))
        .collect();
    files.sort();
    assert!(files.len() >= 2, "{files:?}");
    for file in &files {
        let loaded = Expectations::load(file).unwrap();
        assert!(!loaded.failures.is_empty(), "{}", file.display());
        for e in &loaded.failures {
            let page = e.finding.split('#').next().unwrap();
            let path = root().join("docs/findings").join(page);
            assert!(
                path.is_file(),
                "{} {}: no {}",
                file.display(),
                e.geometry,
                path.display()
            );
            let text = std::fs::read_to_string(&path).unwrap();
            assert!(
                text.contains(&e.geometry),
                "{} ({}) does not mention geometry {}",
                path.display(),
                file.display(),
                e.geometry
            );
        }
    }
}

#[test]
fn the_comparison_reports_a_missing_and_an_unexpected_failure() {
    // kvgeom's own connector passes every case: each listed failure is missing.
    let sources =
        plan::load_sources(&[root().join("geometries/gqa-prefill-logical-larger.toml")]).unwrap();
    let cases = plan::grid(&sources, &plan::PlanOptions::default());
    let reports = execute::run_all(&cases, &RunOptions::default(), None);
    let lines = expectations().compare(&reports);
    assert!(
        lines
            .iter()
            .any(|l| l
                .contains("gqa-prefill-logical-larger N=5 h=0 pull mainline: expected violations")),
        "{lines:?}"
    );
    // An empty list of expectations turns vLLM's failures into unexpected ones.
    let vllm = plan::grid(
        &sources,
        &plan::PlanOptions {
            variant: Variant::Policy(NamedPolicy::Vllm0330),
            ..plan::PlanOptions::default()
        },
    );
    let reports = execute::run_all(&vllm, &RunOptions::default(), None);
    let lines = Expectations::default().compare(&reports);
    assert!(
        lines.iter().any(|l| l.contains("unexpected violations")),
        "{lines:?}"
    );
}
