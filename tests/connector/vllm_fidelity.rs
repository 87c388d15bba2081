//! The project's connector rebuilds every traced vLLM 0.33.0 case and
//! prepares the same descriptor lists (row by row, region-relative) and posts
//! the same transfers (op, lists, ids, notification) as vLLM did.

use std::path::PathBuf;

use kvgeom::connector::Policy;
use kvgeom::trace::{diff_against_connector, TraceCase};

use crate::support::v1_traces;

#[test]
fn all_153_traced_cases_match_vllm() {
    let files = v1_traces();
    assert_eq!(files.len(), 153, "expected the 153 vLLM 0.33.0 cases");
    let mut differences = Vec::new();
    for path in &files {
        let case = TraceCase::read(path).expect("fixture reads");
        let report = diff_against_connector(&case, Policy::default()).expect("replay runs");
        if !report.is_match() {
            differences.push(format!("{}: {report}", case.name));
        }
    }
    assert!(
        differences.is_empty(),
        "{} of 153 differ:\n{}",
        differences.len(),
        differences.join("\n")
    );
}

#[test]
fn the_multi_read_case_posts_one_read_per_prefill_rank() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/vllm-0.33.0/test_hetero_ppl_multi_read_writes_stay_within_request_blocks.jsonl.gz");
    let case = TraceCase::read(&path).unwrap();
    let run = kvgeom::trace::replay(&case, Policy::default()).unwrap();
    let xfers = run.recording.xfers();
    assert_eq!(xfers.len(), 2);
    // Rank 0 carries the MLA pages of both regions plus its SSM shard; rank 1 only its shard.
    assert_eq!(&xfers[0].local_ids[..8], &[6, 7, 8, 15, 30, 31, 32, 39]);
    assert_eq!(&xfers[0].remote_ids[..8], &[2, 3, 8, 9, 26, 27, 32, 33]);
    assert_eq!(xfers[1].local_ids.len(), 16);
}

#[test]
fn a_wrong_connector_is_reported_as_a_difference() {
    // The defect expanding P's ids with D's ppl must not match vLLM.
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/vllm-0.33.0/test_hetero_ppl_token_alignment_sweep_25-12-8.jsonl.gz");
    let mut case = TraceCase::read(&path).unwrap();
    // Pretend vLLM read one block further on P: the replay must now differ.
    case.xfers[0].remote_ids[0] += 1;
    let report = diff_against_connector(&case, Policy::default()).unwrap();
    assert!(!report.is_match());
    assert!(report.to_string().contains("xfer #0 pair 0"), "{report}");
}
