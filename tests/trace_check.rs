//! The descriptor-level oracles on vLLM's own recorded transfers.

use std::path::PathBuf;

use std::process::Command;

use kvgeom::trace::check_case;
use kvgeom::trace::{SkippedCheck, TraceCase};
use serde_json::Value;

/// A (24, 4) trace: its prefill pages cannot hold the state it advertises.
const SWEEP_25_24_4: &str = "test_hetero_ppl_token_alignment_sweep_25-24-4.jsonl.gz";

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
        // vLLM's (24, 4) sweep advertises 56 bytes of state in 48-byte prefill
        // pages; every other trace is checked in full.
        let small_page = path.to_string_lossy().ends_with("-24-4.jsonl.gz");
        let want: &[SkippedCheck] = if small_page { &SkippedCheck::ALL } else { &[] };
        assert_eq!(report.skipped, want, "{}", path.display());
    }
    assert_eq!(checked, 153);
    assert_eq!(notes, 38);
}

#[test]
fn a_trace_whose_prefill_page_is_too_small_still_compares_pair_lengths() {
    let mut case = TraceCase::read(&fixture(SWEEP_25_24_4)).unwrap();
    assert!(check_case(&case).unwrap().violations.is_empty());
    // Pair 12 reads a 6-byte conv row of P; make it a 12-byte one.
    assert_eq!(case.xfers[0].remote_ids[12], 33);
    case.xfers[0].remote_ids[12] = 67;
    let report = check_case(&case).unwrap();
    assert_eq!(report.skipped, SkippedCheck::ALL);
    assert_eq!(report.violations.len(), 1, "{:?}", report.violations);
    let v = &report.violations[0];
    assert_eq!(v.oracle, "pairing");
    assert_eq!(
        v.message,
        "READ xfer 0 pair 12: lengths differ: destination 6 bytes, source 12 bytes"
    );
}

#[test]
fn check_trace_names_the_checks_it_skipped() {
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_kvgeom"))
            .args(args)
            .output()
            .expect("kvgeom runs")
    };
    let small = fixture(SWEEP_25_24_4);
    let full = fixture("test_hetero_ppl_token_alignment_sweep_25-12-8.jsonl.gz");
    let (small, full) = (small.to_str().unwrap(), full.to_str().unwrap());
    let o = run(&["check-trace", small, full]);
    assert_eq!(o.status.code(), Some(0));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains(
            "skipped: pairing beyond pair lengths, prefill-side containment; decode-side containment, \
             coverage, double writes and pair lengths checked"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "2 passed, 0 failed; 1 with checks skipped (a prefill page too small for what it \
             advertises): pairing beyond pair lengths, prefill-side containment"
        ),
        "{text}"
    );
    let o = run(&["check-trace", small, full, "--format", "json"]);
    let report: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(report["summary"]["skipped_checks"], 1, "{report}");
    assert_eq!(
        report["files"][0]["skipped_checks"],
        serde_json::json!(["pairing beyond pair lengths", "prefill-side containment"])
    );
    assert_eq!(report["files"][1]["skipped_checks"], serde_json::json!([]));
    // A trace checked in full says nothing of skipped checks.
    let o = run(&["check-trace", full]);
    assert!(!String::from_utf8_lossy(&o.stdout).contains("skipped"));
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
