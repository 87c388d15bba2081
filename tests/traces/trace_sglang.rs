//! SGLang's traces (`kvgeom-trace/3` naming `sglang`, docs/trace-format.md,
//! "SGLang's runs"): three cases recorded by `kvgeom sweep --connector
//! sglang --record-traces` on SGLang 0.5.23, judged by `check-trace` with
//! the sweep's verdicts, and what a changed byte, a missing field or a
//! changed case does to them. No venv is needed.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use kvgeom::sglang::final_memory::ImageKind;
use kvgeom::sglang::run::judge_trace;
use kvgeom::sglang::trace_file::SglangTrace;
use serde_json::Value;

use crate::support::{kvgeom, root, scratch, text};

const FIXTURES: &str = "tests/fixtures/sglang-0.5.23-traces";
/// Passes (prefill TP4 ranks replicating the two heads: redundant writes).
const PASSING: &str = "gqa-2heads-p4-d1-push-n5-hit0-mainline-s0.trace.json.gz";
/// V heads smaller than K's: SGLang 0.5.23 copies V at K's head size.
const V_HEAD: &str = "gqa-v-head-size-p1-d2-push-n5-hit0-mainline-s0.trace.json.gz";
/// A Mamba2 conv state sliced as one block across x | B | C.
const MAMBA2: &str = "hybrid-mamba2-xbc-p1-d2-push-n5-hit0-mainline-s0.trace.json.gz";

fn fixture(name: &str) -> PathBuf {
    root().join(FIXTURES).join(name)
}

fn json_of(path: &Path) -> Value {
    let mut s = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(path).expect("open"))
        .read_to_string(&mut s)
        .expect("gunzip");
    serde_json::from_str(&s).expect("json")
}

fn write_json(dir: &Path, name: &str, v: &Value) -> PathBuf {
    let path = dir.join(name);
    let mut gz = flate2::write::GzEncoder::new(
        std::fs::File::create(&path).expect("create"),
        flate2::Compression::fast(),
    );
    gz.write_all(v.to_string().as_bytes()).expect("write");
    gz.finish().expect("finish");
    path
}

#[test]
fn check_trace_gives_the_sweeps_verdicts_on_sglangs_traces() {
    let o = kvgeom(&["check-trace", "--format", "json", FIXTURES]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let report: Value = serde_json::from_slice(&o.stdout).expect("report");
    let verdicts: Vec<(String, String)> = report["files"]
        .as_array()
        .expect("files")
        .iter()
        .map(|f| {
            let file = f["file"].as_str().unwrap_or_default();
            let name = Path::new(file).file_name().unwrap_or_default();
            (
                name.to_string_lossy().into_owned(),
                f["verdict"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    assert_eq!(
        verdicts,
        [
            (PASSING.to_string(), "passed".to_string()),
            (V_HEAD.to_string(), "violations".to_string()),
            (MAMBA2.to_string(), "violations".to_string()),
        ]
    );
    let messages: Vec<&str> = report["files"]
        .as_array()
        .expect("files")
        .iter()
        .map(|f| f["message"].as_str().unwrap_or_default())
        .collect();
    assert!(messages[0].contains("byte level"), "{}", messages[0]);
    // The oracles the sweep named (expected/sglang-0.5.23.toml).
    assert!(
        messages[1].contains("[coverage]") && messages[1].contains("[pairing]"),
        "{}",
        messages[1]
    );
    assert!(
        messages[2].contains("[pairing]") && messages[2].contains("state pair"),
        "{}",
        messages[2]
    );
    let o = kvgeom(&["check-trace", fixture(PASSING).to_str().expect("path")]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("SGLang 0.5.23"), "{}", text(&o));
}

#[test]
fn a_changed_byte_of_decodes_or_prefills_memory_is_a_violation() {
    let path = fixture(PASSING);
    let clean = SglangTrace::read(&path).expect("trace");
    assert!(judge_trace(&clean).report.passed());
    let (decode_pages, page_size) = (
        clean.prepared.placement.decode_pages.clone(),
        u64::from(clean.prepared.decode.page_size),
    );
    // A byte of the request's first token in decode's first region.
    let row = clean.prepared.decode.regions(0)[0].item_len / page_size;
    let offset = u64::from(decode_pages[0]) * page_size * row;
    let mut broken = SglangTrace::read(&path).expect("trace");
    let images = broken.images.as_mut().expect("images");
    let image = images
        .get_mut(&("decode-0".to_string(), ImageKind::Region, 0))
        .expect("decode-0 region 0");
    image[offset as usize] ^= 0x01;
    let r = judge_trace(&broken).report;
    assert!(!r.passed(), "{}", r.outcome.describe());
    assert!(
        r.violations
            .iter()
            .any(|v| v.oracle == "transferred_or_zeroed"),
        "{:?}",
        r.violations
    );
    // Prefill's memory is recorded where it differs from the preparation.
    let mut broken = SglangTrace::read(&path).expect("trace");
    let mut image = kvgeom::sglang::images::prefill_region(
        &broken.prepared.prefill,
        1,
        2,
        &broken.prepared.placement.prefill_pages,
    );
    image[0] ^= 0x80;
    broken
        .images
        .as_mut()
        .expect("images")
        .insert(("prefill-1".to_string(), ImageKind::Region, 2), image);
    let r = judge_trace(&broken).report;
    assert!(
        r.violations
            .iter()
            .any(|v| v.oracle == "neighbour_preservation"),
        "{:?}",
        r.violations
    );
}

#[test]
fn a_trace_without_memory_is_judged_on_its_pairs_and_says_what_it_skipped() {
    let dir = scratch(module_path!(), "no-memory");
    for (name, verdict) in [(PASSING, "passed"), (V_HEAD, "violations")] {
        let mut v = json_of(&fixture(name));
        let obj = v.as_object_mut().expect("object");
        obj.remove("memory");
        obj.insert("memory_left_out".into(), "left out by the test".into());
        let path = write_json(&dir, name, &v);
        let o = kvgeom(&[
            "check-trace",
            "--format",
            "json",
            path.to_str().expect("path"),
        ]);
        let report: Value = serde_json::from_slice(&o.stdout).expect("report");
        let f = &report["files"][0];
        assert_eq!(f["verdict"], verdict, "{}", text(&o));
        let message = f["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("pairs only") && message.contains("left out by the test"),
            "{message}"
        );
    }
}

/// A change made to a trace's JSON.
type Change = Box<dyn Fn(&mut Value)>;

#[test]
fn a_malformed_sglang_trace_is_exit_2_naming_the_problem() {
    let dir = scratch(module_path!(), "malformed");
    let good = json_of(&fixture(PASSING));
    let cases: Vec<(&str, Change, &str)> = vec![
        (
            "no-seed",
            Box::new(|v| {
                v["case"].as_object_mut().expect("case").remove("seed");
            }),
            "missing field `seed`",
        ),
        (
            "other-prompt",
            Box::new(|v| v["case"]["prompt_len"] = 6.into()),
            "case.driver_case.",
        ),
        (
            "other-seed",
            Box::new(|v| v["case"]["seed"] = 1.into()),
            "case.driver_case.decode",
        ),
        (
            "unknown-field",
            Box::new(|v| v["extra"] = 1.into()),
            "unknown field `extra`",
        ),
        (
            "short-image",
            Box::new(|v| v["memory"]["images"][0]["after"] = "AAAA".into()),
            "3 bytes, the model's has",
        ),
        (
            "result-format",
            Box::new(|v| v["result"]["format"] = "x".into()),
            "result.format \"x\"",
        ),
        (
            "both-memories",
            Box::new(|v| v["memory_left_out"] = "x".into()),
            "either memory or memory_left_out",
        ),
    ];
    for (name, change, says) in cases {
        let mut v = good.clone();
        change(&mut v);
        let path = write_json(&dir, &format!("{name}.trace.json.gz"), &v);
        let o = kvgeom(&["check-trace", path.to_str().expect("path")]);
        assert_eq!(o.status.code(), Some(2), "{name}: {}", text(&o));
        let t = text(&o);
        assert!(t.contains(says), "{name}: {t}");
        assert!(t.contains(&format!("{name}.trace.json.gz")), "{name}: {t}");
        assert!(!t.contains("panicked"), "{name}: {t}");
    }
}

#[test]
fn diff_trace_refuses_an_sglang_trace_with_the_reason() {
    let o = kvgeom(&["diff-trace", fixture(PASSING).to_str().expect("path")]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("an SGLang trace") && text(&o).contains("check-trace judges it"),
        "{}",
        text(&o)
    );
}
