//! The descriptor-level oracles on vLLM's own recorded transfers.

use std::path::PathBuf;

use kvgeom::trace::check_case;
use kvgeom::trace::TraceCase;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/vllm-0.33.0")
        .join(name)
}

#[test]
fn every_fixture_passes_the_descriptor_level_oracles() {
    let dir = fixture("");
    let mut checked = 0;
    let mut notes = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if !path.to_string_lossy().ends_with(".jsonl.gz") {
            continue;
        }
        let report = check_case(&TraceCase::read(&path).unwrap()).unwrap();
        assert!(
            report.violations.is_empty(),
            "{}: {:?}",
            path.display(),
            report.violations
        );
        checked += 1;
        notes += usize::from(!report.notes.is_empty());
    }
    assert_eq!(checked, 153);
    // vLLM's (24, 4) sweep advertises 56 bytes of state in 48-byte prefill pages.
    assert_eq!(notes, 38);
}

#[test]
fn a_misrouted_read_in_a_trace_is_caught() {
    let mut case = TraceCase::read(&fixture(
        "test_hetero_ppl_token_alignment_sweep_25-12-8.jsonl.gz",
    ))
    .unwrap();
    // Read P's kernel blocks of the first attention pair in the wrong order.
    case.xfers[0].remote_ids.swap(0, 1);
    let report = check_case(&case).unwrap();
    let oracles: Vec<&str> = report.violations.iter().map(|v| v.oracle).collect();
    assert!(oracles.contains(&"pairing"), "{:?}", report.violations);
    // Dropping the second rank's read loses its state shards.
    let mut case = TraceCase::read(&fixture(
        "test_hetero_ppl_token_alignment_sweep_25-12-8.jsonl.gz",
    ))
    .unwrap();
    case.xfers.pop();
    let report = check_case(&case).unwrap();
    assert!(
        report.violations.iter().any(|v| v.oracle == "coverage"),
        "{:?}",
        report.violations
    );
}
