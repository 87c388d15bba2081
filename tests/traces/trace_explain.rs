//! `diff-trace` names the known defects that explain a difference.
//!
//! Every recorded vLLM 0.33.0 fixture matches kvgeom's connector, so the
//! differing traces here are derived from real ones: the recorded trace with
//! its transfers (and rewritten remote ids) replaced by what a defect's
//! policy does, on the recorded request or on the same request with a
//! prefix hit of one decode block. A trace with one id changed by hand is
//! what no defect explains.

use std::path::{Path, PathBuf};

use kvgeom::connector::Policy;
use kvgeom::defects::Defect;
use kvgeom::trace::{diff_against_connector, explain_difference, replay, Explanation, TraceCase};
use serde_json::Value;

use crate::support::{json_report, kvgeom, scratch, trace_lines, v1_trace};

const SWEEP_25_12_8: &str = "test_hetero_ppl_token_alignment_sweep_25-12-8.jsonl.gz";
const SWEEP_20_16_24: &str = "test_hetero_ppl_token_alignment_sweep_20-16-24.jsonl.gz";
const MULTI_READ: &str = "test_hetero_ppl_multi_read_writes_stay_within_request_blocks.jsonl.gz";

/// How a derived trace changes the recorded request.
#[derive(Clone, Copy)]
enum Request {
    /// As recorded.
    Recorded,
    /// Decode's first attention block already computed (a prefix hit): it
    /// leaves the request, as in vLLM's own requests.
    PrefixHitOfOneBlock,
}

fn with_prefix_hit(computed: &mut Value, groups: usize) {
    let mut counts = vec![0u64; groups];
    counts[0] = 1;
    *computed = counts.into();
}

/// The request's blocks without decode's first attention block (and its
/// kernel blocks), which the prefix hit holds.
fn without_first_block(blocks: &mut Value, ppl: usize) {
    let logical = blocks["local_block_ids"][0].as_array_mut().unwrap();
    logical.remove(0);
    let physical = blocks["local_physical_block_ids"][0]
        .as_array_mut()
        .unwrap();
    physical.drain(..ppl);
}

/// The fixture `name` as `policy` would have traced it: its events with the
/// request changed as `request` says and every transfer's ids and the
/// rewritten remote ids replaced by the rebuild under `policy`.
fn derived_trace(name: &str, request: Request, policy: Policy) -> Vec<Value> {
    let mut lines = trace_lines(&v1_trace(name));
    let mut case = TraceCase::read(&v1_trace(name)).unwrap();
    let groups = case.request.blocks.local_block_ids.len();
    let ppl = case.local_geometry.physical_blocks_per_logical as usize;
    if let Request::PrefixHitOfOneBlock = request {
        case.request.blocks.local_num_computed_blocks = vec![0; groups];
        case.request.blocks.local_num_computed_blocks[0] = 1;
        case.request.blocks.local_block_ids[0].remove(0);
        case.request.blocks.local_physical_block_ids[0].drain(..ppl);
    }
    let run = replay(&case, policy).expect("the rebuild runs");
    let xfers = run.recording.xfers();
    assert_eq!(
        xfers.len(),
        case.xfers.len(),
        "{name}: same number of reads"
    );
    let mut next = xfers.iter();
    for line in &mut lines {
        match line["ev"].as_str() {
            Some("case") => {
                if let Request::PrefixHitOfOneBlock = request {
                    line["args"]["cached"] = 1.into();
                }
            }
            Some("request") => {
                if let Request::PrefixHitOfOneBlock = request {
                    with_prefix_hit(&mut line["local_num_computed_blocks"], groups);
                    without_first_block(line, ppl);
                }
            }
            Some("xfer") => {
                let x = next.next().unwrap();
                line["local_ids"] = x.local_ids.to_vec().into();
                line["remote_ids"] = x.remote_ids.to_vec().into();
            }
            Some("request_done") => {
                line["after_call"]["remote_block_ids"] = run.remote_kernel_ids.clone().into();
                if let Request::PrefixHitOfOneBlock = request {
                    with_prefix_hit(&mut line["after_call"]["local_num_computed_blocks"], groups);
                    without_first_block(&mut line["after_call"], ppl);
                }
            }
            _ => {}
        }
    }
    lines
}

fn write_trace(path: &Path, lines: &[Value]) {
    let mut text = String::new();
    for line in lines {
        text.push_str(&line.to_string());
        text.push('\n');
    }
    std::fs::write(path, text).unwrap();
}

/// The derived traces of the tests, by file name, with what must explain
/// each (`None`: nothing does).
fn derived_traces(dir: &Path) -> Vec<(PathBuf, Option<&'static str>)> {
    let mut out = Vec::new();
    let mut add = |file: &str, lines: Vec<Value>, explained_by: Option<&'static str>| {
        let path = dir.join(file);
        write_trace(&path, &lines);
        out.push((path, explained_by));
    };
    add(
        "local-ppl-25-12-8.jsonl",
        derived_trace(
            SWEEP_25_12_8,
            Request::Recorded,
            Defect::RemoteIdsLocalPpl.policy(),
        ),
        Some("remote-ids-local-ppl"),
    );
    add(
        "local-ppl-multi-read.jsonl",
        derived_trace(
            MULTI_READ,
            Request::Recorded,
            Defect::RemoteIdsLocalPpl.policy(),
        ),
        Some("remote-ids-local-ppl"),
    );
    // vLLM 0.33.0 as released end-trims P's list after a prefix hit.
    add(
        "end-trim-20-16-24.jsonl",
        derived_trace(
            SWEEP_20_16_24,
            Request::PrefixHitOfOneBlock,
            Policy::vllm_0_33_0(),
        ),
        Some("end-trim-alignment"),
    );
    add(
        "end-trim-multi-read.jsonl",
        derived_trace(
            MULTI_READ,
            Request::PrefixHitOfOneBlock,
            Policy::vllm_0_33_0(),
        ),
        Some("end-trim-alignment"),
    );
    // One id changed by hand: P's block 4 read as block 5.
    let mut edited = trace_lines(&v1_trace(SWEEP_25_12_8));
    for line in &mut edited {
        if line["ev"] == "xfer" && line["handle"] == 6 {
            line["remote_ids"][0] = 5.into();
        }
    }
    add("one-id-changed-25-12-8.jsonl", edited, None);
    out
}

#[test]
fn derived_traces_differ_and_the_defect_that_made_them_explains_them() {
    let dir = scratch(module_path!(), "library");
    for (path, want) in derived_traces(&dir) {
        let case = TraceCase::read(&path).unwrap();
        let report = diff_against_connector(&case, Policy::default()).unwrap();
        assert!(!report.is_match(), "{}: matches", path.display());
        let explanation = explain_difference(&case);
        assert_eq!(
            explanation.names().as_deref(),
            want,
            "{}: {explanation}",
            path.display()
        );
        if want.is_none() {
            assert_eq!(explanation, Explanation::Unexplained);
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_end_trimmed_trace_is_what_vllm_0_33_0_does() {
    let dir = scratch(module_path!(), "vllm");
    let path = dir.join("end-trim.jsonl");
    write_trace(
        &path,
        &derived_trace(
            SWEEP_20_16_24,
            Request::PrefixHitOfOneBlock,
            Policy::vllm_0_33_0(),
        ),
    );
    let case = TraceCase::read(&path).unwrap();
    assert!(diff_against_connector(&case, Policy::vllm_0_33_0())
        .unwrap()
        .is_match());
    assert_eq!(
        explain_difference(&case),
        Explanation::Defect(Defect::EndTrimAlignment)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn diff_trace_reports_explained_by_and_still_exits_1() {
    let dir = scratch(module_path!(), "cli");
    let traces = derived_traces(&dir);
    std::fs::copy(
        v1_trace(SWEEP_25_12_8),
        dir.join("recorded-25-12-8.jsonl.gz"),
    )
    .unwrap();

    let o = kvgeom(&["diff-trace", dir.to_str().unwrap(), "--format", "json"]);
    assert_eq!(o.status.code(), Some(1));
    let report = json_report(&o);
    let files = report["files"].as_array().unwrap();
    assert_eq!(files.len(), traces.len() + 1, "{report}");
    for (path, want) in &traces {
        let entry = files
            .iter()
            .find(|f| f["file"] == path.to_str().unwrap())
            .unwrap_or_else(|| panic!("{} not reported: {report}", path.display()));
        assert_eq!(entry["verdict"], "differ", "{entry}");
        assert_eq!(entry["explained_by"], want.map_or(Value::Null, Value::from));
    }
    let recorded = files
        .iter()
        .find(|f| {
            f["file"]
                .as_str()
                .unwrap()
                .ends_with("recorded-25-12-8.jsonl.gz")
        })
        .unwrap();
    assert_eq!(recorded["verdict"], "match");
    assert_eq!(recorded["explained_by"], Value::Null);
    assert_eq!(report["summary"]["failed"], traces.len());
    assert_eq!(report["summary"]["explained"], traces.len() - 1);

    // The text says it too.
    let o = kvgeom(&["diff-trace", dir.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains(
            "end-trim-20-16-24.jsonl: xfer #0 pair 2: local id expected 14 found 44\n  \
             differs; explained by defect `end-trim-alignment` (vLLM 0.33.0 end-trim alignment)"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "one-id-changed-25-12-8.jsonl: xfer #0 pair 0: remote id expected 5 found 4\n  \
             differs; no known defect explains it"
        ),
        "{text}"
    );
    assert!(
        text.contains("1 match, 5 differ (4 explained by known defects)"),
        "{text}"
    );

    // Under vLLM 0.33.0's own policy nothing is explained: that policy is
    // the reproduction being judged.
    let o = kvgeom(&[
        "diff-trace",
        dir.to_str().unwrap(),
        "--policy",
        "vllm-0.33.0",
        "--format",
        "json",
    ]);
    assert_eq!(o.status.code(), Some(1));
    let report = json_report(&o);
    for entry in report["files"].as_array().unwrap() {
        assert_eq!(entry["explained_by"], Value::Null, "{entry}");
        let file = entry["file"].as_str().unwrap();
        let want = if file.contains("end-trim") || file.contains("recorded") {
            "match"
        } else {
            "differ"
        };
        assert_eq!(entry["verdict"], want, "{entry}");
    }
    assert_eq!(report["summary"]["explained"], 0);
    let o = kvgeom(&[
        "diff-trace",
        dir.to_str().unwrap(),
        "--policy",
        "vllm-0.33.0",
    ]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(!text.contains("explained"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn no_recorded_fixture_needs_an_explanation() {
    let o = kvgeom(&[
        "diff-trace",
        v1_trace("").to_str().unwrap(),
        "--format",
        "json",
    ]);
    assert_eq!(o.status.code(), Some(0));
    let report = json_report(&o);
    assert_eq!(report["summary"]["passed"], 153);
    assert_eq!(report["summary"]["explained"], 0);
    assert!(report["files"]
        .as_array()
        .unwrap()
        .iter()
        .all(|f| f["explained_by"].is_null()));
}
