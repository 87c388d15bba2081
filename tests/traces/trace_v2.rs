//! v2 traces (docs/trace-format.md): the live driver's recordings of vLLM
//! 0.33.0's real connector, judged by `check-trace` and `diff-trace`; and
//! v3 traces, kvgeom's own connector recorded by `--record-traces` and
//! `--record-trace`, read back with the verdicts of the run they record.
//!
//! The fixtures need no venv. The recording test needs it (or an
//! interpreter named by `KVGEOM_VLLM_PYTHON`) and says why it is skipped
//! without one.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::support::{scratch, skip, v2_trace};

const FIXTURES: &str = "tests/fixtures/live-traces-vllm-0.33.0";

/// The JSON report of `kvgeom ARGS --format json FILE`: (verdict,
/// message, explained_by) of its one file.
pub(crate) fn verdict(args: &[&str], file: &Path) -> (String, String, Option<String>) {
    let out = Command::new(env!("CARGO_BIN_EXE_kvgeom"))
        .args(args)
        .args(["--format", "json"])
        .arg(file)
        .output()
        .expect("run kvgeom");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{}: no JSON report ({e}): {}",
            file.display(),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert_eq!(report["schema"], "kvgeom-trace-verdicts/1");
    let f = &report["files"][0];
    (
        f["verdict"].as_str().unwrap_or_default().to_string(),
        f["message"].as_str().unwrap_or_default().to_string(),
        f["explained_by"].as_str().map(str::to_string),
    )
}

/// Each fixture: check-trace's verdict, diff-trace's under kvgeom's policy
/// (with the defects that explain a difference) and under vLLM 0.33.0's.
const VERDICTS: &[(&str, &str, &str, Option<&str>)] = &[
    // GQA + Mamba2 HND, P TP2 (ppl 1) -> D TP1 (ppl 2).
    (
        "nemotron-h-gqa-mamba2-hnd-pull-n13-hit0-mainline-s0",
        "passed",
        "match",
        None,
    ),
    // Prefix hits on an equal-ppl hybrid, both allocation models.
    (
        "mla-kda-equal-ppl-prefix-cache-pull-n37-hit16-mainline-s0",
        "passed",
        "match",
        None,
    ),
    (
        "mla-kda-equal-ppl-prefix-cache-pull-n37-hit16-with-last-token-s0",
        "passed",
        "match",
        None,
    ),
    // Decode TP2 > prefill TP1: MLA + KDA, GQA + GDN, GQA + Mamba2 (one
    // replicated B/C group, which vLLM 0.33.0 reads wrongly).
    (
        "mla-kda-decode-tp2-pull-n13-hit0-mainline-s0",
        "passed",
        "match",
        None,
    ),
    (
        "qwen3-next-gqa-gdn-decode-tp2-pull-n9-hit0-mainline-s0",
        "passed",
        "match",
        None,
    ),
    (
        "mamba2-replicated-groups-p1-d2-pull-n9-hit0-mainline-s0",
        "violations",
        "differ",
        Some("conv-offsets-scaled"),
    ),
    // A kernel ratio with equal ppl: fine without a prefix hit, vLLM's
    // end-trimmed alignment with one.
    (
        "mla-kda-kernel-ratio-equal-ppl-prefix-cache-pull-n21-hit0-mainline-s0",
        "passed",
        "match",
        None,
    ),
    (
        "mla-kda-kernel-ratio-equal-ppl-prefix-cache-pull-n21-hit16-mainline-s0",
        "violations",
        "differ",
        Some("end-trim-alignment"),
    ),
    // Push with equal ppl: prefill's WRITEs land.
    (
        "mla-kda-equal-ppl-prefix-cache-push-n13-hit0-mainline-s0",
        "passed",
        // kvgeom's D runs the post-process on the counts P reports (here
        // nothing to zero); vLLM 0.33.0's push reports none and calls none.
        "differ",
        Some("push-empty-remote-ids"),
    ),
    // Push with different ppl: vLLM's decode crashes.
    (
        "mla-kda-push-prefix-cache-prefill-kernel-larger-push-n13-hit0-mainline-s0",
        "violations",
        "differ",
        Some("push-empty-remote-ids"),
    ),
    (
        "nemotron-h-gqa-mamba2-hnd-push-n13-hit0-mainline-s0",
        "violations",
        "differ",
        Some("push-empty-remote-ids"),
    ),
    // A pair vLLM 0.33.0 should refuse but accepts (P TP8 with replicated
    // heads in NHD pages -> D TP2).
    (
        "reject-gqa-nhd-replicated-heads-pull-n4-hit0-mainline-s0",
        "violations",
        "differ",
        Some("replicated-heads-nhd-accepted"),
    ),
    // A refused handshake (pull), and the same pair in push, where vLLM's
    // prefill logs the refusal and decode waits for ever.
    (
        "reject-g1-prefix-caching-pull-n13-hit0-mainline-s0",
        "rejected",
        "match",
        None,
    ),
    (
        "reject-g1-prefix-caching-push-n13-hit0-mainline-s0",
        "violations",
        "differ",
        Some("push-empty-remote-ids"),
    ),
    // Receive post-process: MLA with a kernel ratio (the token tail zeroed,
    // no conversion) and GQA + Mamba2 with a kernel ratio (converted and
    // zeroed; vLLM 0.33.0 scales the replicated groups' conv offsets).
    (
        "g5-mla-kda-mixed-kernel-pull-n9-hit0-mainline-s0",
        "passed",
        "match",
        None,
    ),
    (
        "mamba2-replicated-groups-p4-d2-pull-n13-hit0-mainline-s0",
        "violations",
        "differ",
        Some("conv-offsets-scaled"),
    ),
];

#[test]
fn every_fixture_has_its_pinned_verdicts() {
    for &(name, check, diff, explained) in VERDICTS {
        let file = v2_trace(name);
        let (v, message, _) = verdict(&["check-trace"], &file);
        assert_eq!(v, check, "check-trace {name}: {message}");
        if v == "passed" {
            assert!(message.contains("byte level"), "{name}: {message}");
        }
        let (v, message, by) = verdict(&["diff-trace"], &file);
        assert_eq!(v, diff, "diff-trace {name}: {message}");
        assert_eq!(by.as_deref(), explained, "diff-trace {name}: {message}");
        let (v, message, by) = verdict(&["diff-trace", "--policy", "vllm-0.33.0"], &file);
        assert_eq!(
            v, "match",
            "diff-trace --policy vllm-0.33.0 {name}: {message}"
        );
        assert_eq!(by, None);
    }
}

/// A trace of a vLLM release kvgeom does not model is still judged, but its
/// difference from kvgeom's plan is information (the verdict says so), and
/// only single defects can explain it (the release has no known set).
#[test]
fn a_trace_of_a_release_kvgeom_does_not_model_is_compared_as_information() {
    let name = "mamba2-replicated-groups-p1-d2-pull-n9-hit0-mainline-s0";
    let pinned = v2_trace(name);
    let (v, message, by) = verdict(&["diff-trace"], &pinned);
    assert_eq!(
        (v.as_str(), by.as_deref()),
        ("differ", Some("conv-offsets-scaled"))
    );
    assert!(!message.contains("information"), "{message}");
    let dir = scratch(module_path!(), "unmodelled");
    let mut trace = load(name);
    trace["vllm_version"] = "0.32.0".into();
    let file = write(&dir, name, &trace);
    let (v, message, by) = verdict(&["diff-trace"], &file);
    assert_eq!(v, "differ", "{message}");
    assert!(
        message.ends_with(
            "(vLLM 0.32.0 is not a release kvgeom models: the comparison is information)"
        ),
        "{message}"
    );
    assert_eq!(by.as_deref(), Some("conv-offsets-scaled"), "{message}");
    // The oracles judge vLLM's bytes whatever release wrote them.
    let (v, message, _) = verdict(&["check-trace"], &file);
    assert_eq!(v, verdict(&["check-trace"], &pinned).0, "{message}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn every_fixture_is_pinned() {
    let mut names: Vec<String> =
        std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(FIXTURES))
            .expect("fixtures")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .filter_map(|n| n.strip_suffix(".trace.json.gz").map(str::to_string))
            .collect();
    names.sort();
    let mut pinned: Vec<String> = VERDICTS.iter().map(|v| v.0.to_string()).collect();
    pinned.sort();
    assert_eq!(names, pinned);
}

// The v1 corpus: v1 traces (one per decode rank) and the v2 trace of the
// same case, recorded together from vLLM 0.33.0's pull worker by
// scripts/record-v1-trace-corpus.sh, with the true verdicts that
// scripts/v1-trace-truth.py computed from their desc ids (`truth.json`,
// which also covers the v1 reproducers).

const V1_CORPUS: &str = "tests/fixtures/vllm-0.33.0-v1-corpus";
const V1_REPRODUCERS: &str = "tests/fixtures/vllm-0.33.0-v1-reproducers";

/// `truth.json`: per file (relative to tests/fixtures/), its true verdicts.
fn v1_truth() -> serde_json::Map<String, Value> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(V1_CORPUS)
        .join("truth.json");
    let text = std::fs::read_to_string(&path).expect("truth.json");
    match serde_json::from_str(&text).expect("truth.json is JSON") {
        Value::Object(map) => map,
        _ => panic!("truth.json: not an object"),
    }
}

/// One run of `kvgeom ARGS --format json FILES...`: per file name, its
/// (verdict, message).
fn verdicts(
    args: &[&str],
    files: &[PathBuf],
) -> std::collections::BTreeMap<String, (String, String)> {
    let out = Command::new(env!("CARGO_BIN_EXE_kvgeom"))
        .args(args)
        .args(["--format", "json"])
        .args(files)
        .output()
        .expect("run kvgeom");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{args:?}: no JSON report ({e}): {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let mut by_name = std::collections::BTreeMap::new();
    for f in report["files"].as_array().expect("files") {
        let file = f["file"].as_str().unwrap_or_default();
        let name = Path::new(file)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        // The message's start: enough to tell why, short enough to list many.
        let message: String = f["message"]
            .as_str()
            .unwrap_or_default()
            .chars()
            .take(240)
            .collect();
        by_name.insert(
            name,
            (
                f["verdict"].as_str().unwrap_or_default().to_string(),
                message,
            ),
        );
    }
    by_name
}

/// The v1 corpus files and reproducers truth.json names, as paths.
fn v1_files(truth: &serde_json::Map<String, Value>) -> Vec<PathBuf> {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    truth.keys().map(|k| fixtures.join(k)).collect()
}

#[test]
fn v1_corpus_verdicts_are_the_true_ones() {
    let truth = v1_truth();
    let files = v1_files(&truth);
    // Every v1 file of both folders has its truth, and only those.
    let mut on_disk = Vec::new();
    for dir in [V1_CORPUS, V1_REPRODUCERS] {
        for e in std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(dir)).expect(dir) {
            let name = e.expect("entry").file_name().to_string_lossy().into_owned();
            if name.ends_with(".jsonl") || name.ends_with(".jsonl.gz") {
                on_disk.push(format!(
                    "{}/{name}",
                    dir.trim_start_matches("tests/fixtures/")
                ));
            }
        }
    }
    on_disk.sort();
    let named: Vec<String> = truth.keys().cloned().collect();
    assert_eq!(on_disk, named, "truth.json names every v1 file");
    assert!(
        named.len() >= 20,
        "a corpus, not a handful: {}",
        named.len()
    );
    let check = verdicts(&["check-trace"], &files);
    let diff = verdicts(&["diff-trace", "--policy", "vllm-0.33.0"], &files);
    let mut wrong = Vec::new();
    for (key, t) in &truth {
        let name = key.rsplit('/').next().unwrap_or(key);
        let (want_check, want_diff) = (t["check"].as_str().unwrap(), t["diff"].as_str().unwrap());
        let (c, cm) = check.get(name).cloned().unwrap_or_default();
        let (d, dm) = diff.get(name).cloned().unwrap_or_default();
        if want_check == "refused" {
            // A refusal names its reason and judges nothing.
            for (cmd, v, m) in [("check-trace", &c, &cm), ("diff-trace", &d, &dm)] {
                let judged =
                    ["passed", "violations", "rejected", "match", "differ"].contains(&v.as_str());
                if judged || m.trim().is_empty() {
                    wrong.push(format!(
                        "{name}: {cmd}: want a refusal ({}), got {v}: {m}",
                        t["reason_class"]
                    ));
                }
            }
            continue;
        }
        if c != want_check {
            wrong.push(format!(
                "{name}: check-trace: want {want_check}, got {c}: {cm}"
            ));
        }
        if d != want_diff {
            wrong.push(format!(
                "{name}: diff-trace --policy vllm-0.33.0: want {want_diff}, got {d}: {dm}"
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} files:\n{}",
        wrong.len(),
        truth.len(),
        wrong.join("\n")
    );
}

#[test]
fn v1_corpus_verdicts_equal_their_v2_cases() {
    let truth = v1_truth();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(V1_CORPUS);
    // Each v1 file `<case>-d<rank>.jsonl.gz` with its case's v2 trace.
    let mut pairs = Vec::new();
    for key in truth.keys() {
        let Some(name) = key.strip_prefix("vllm-0.33.0-v1-corpus/") else {
            continue;
        };
        let Some((case, _rank)) = name
            .strip_suffix(".jsonl.gz")
            .and_then(|s| s.rsplit_once("-d"))
        else {
            continue;
        };
        let v2 = dir.join(format!("{case}.trace.json.gz"));
        if v2.exists() {
            pairs.push((key.clone(), name.to_string(), v2));
        }
    }
    assert!(pairs.len() >= 10, "v1/v2 pairs: {}", pairs.len());
    let mut files: Vec<PathBuf> = pairs.iter().map(|p| dir.join(&p.1)).collect();
    files.extend(pairs.iter().map(|p| p.2.clone()));
    files.dedup();
    let check = verdicts(&["check-trace"], &files);
    let mut wrong = Vec::new();
    for (key, name, v2) in &pairs {
        let v2_name = v2.file_name().unwrap().to_string_lossy().into_owned();
        let (v2_verdict, v2m) = check.get(&v2_name).cloned().unwrap_or_default();
        let want = truth[key]["check"].as_str().unwrap();
        if want == "refused" {
            // kvgeom's v1 reader refuses GQA, and a handshake vLLM refused
            // before any read; its v2 reader judges the case.
            let judged: &[&str] = if truth[key]["reason_class"] == "handshake" {
                &["rejected"]
            } else {
                &["passed", "violations"]
            };
            assert!(
                judged.contains(&v2_verdict.as_str()),
                "{v2_name}: {v2_verdict}: {v2m}"
            );
            continue;
        }
        // The independent truth of the v1 file is the v2 verdict of its case.
        if v2_verdict != want {
            wrong.push(format!(
                "{name}: truth {want}, v2 check-trace {v2_verdict}: {v2m}"
            ));
        }
        let (v1_verdict, v1m) = check.get(name).cloned().unwrap_or_default();
        if v1_verdict != v2_verdict {
            wrong.push(format!(
                "{name}: v1 check-trace {v1_verdict} ({v1m}), v2 {v2_verdict}"
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} pairs:\n{}",
        wrong.len(),
        pairs.len(),
        wrong.join("\n")
    );
}

/// A v1 trace whose handshake vLLM refused before any read holds no
/// request: both commands refuse it naming the handshake's exception, and
/// the truth script says so; with its request kept, check-trace reports the
/// rejection.
#[test]
fn a_v1_handshake_refused_before_any_read_is_refused_naming_it() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let base = std::fs::read_to_string(
        root.join(V1_REPRODUCERS)
            .join("A1-mla-kda-16-4-prefix-tp1-tp1_N18-c1-mainline.jsonl"),
    )
    .expect("reproducer");
    let dir = scratch(module_path!(), "v1-handshake-refused");
    let write = |name: &str, keep_request: bool| -> PathBuf {
        let mut text = String::new();
        let mut seq = 0u64;
        for line in base.lines() {
            let mut e: Value = serde_json::from_str(line).expect("event");
            if e["ev"] == "add_remote_agent" {
                e["exception"] = Value::from("RuntimeError: refused by the test");
                e["result"] = Value::Null;
            }
            let read =
                ["request", "xfer", "request_done"].contains(&e["ev"].as_str().unwrap_or(""));
            if read && !keep_request {
                continue;
            }
            e["seq"] = Value::from(seq);
            seq += 1;
            text.push_str(&e.to_string());
            text.push('\n');
        }
        let path = dir.join(format!("{name}.jsonl"));
        std::fs::write(&path, text).expect("write");
        path
    };
    let no_read = write("no-read", false);
    let with_read = write("with-read", true);
    let files = [no_read, with_read];
    for args in [
        &["check-trace"][..],
        &["diff-trace", "--policy", "vllm-0.33.0"],
    ] {
        let got = verdicts(args, &files);
        let (v, m) = &got["no-read.jsonl"];
        assert_eq!(v, "error", "{args:?}: {m}");
        assert!(
            m.contains("refused:") && m.contains("`add_remote_agent` field `exception`"),
            "{args:?}: {m}"
        );
    }
    let (v, m) = &verdicts(&["check-trace"], &files)["with-read.jsonl"];
    assert_eq!(v, "rejected", "{m}");
    if Command::new("python3")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        let manifest = truth_manifest(&dir, &[".".as_ref()]);
        let entry = |name: &str| {
            manifest
                .as_object()
                .and_then(|m| m.iter().find(|(k, _)| k.ends_with(name)))
                .map(|(_, v)| v.clone())
                .unwrap_or_else(|| panic!("{name} in {manifest}"))
        };
        assert_eq!(entry("no-read.jsonl")["check"], "refused");
        assert_eq!(entry("no-read.jsonl")["reason_class"], "handshake");
        assert_eq!(entry("with-read.jsonl")["check"], "rejected");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// vLLM 0.33.0 raised in the read of the committed decode-logical-larger
/// case, as kvgeom's model of it refuses the read: that matches; a trace
/// saying vLLM's read went through differs.
#[test]
fn a_read_one_connector_refused_differs() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let name = "mla-decode-logical-larger-pull-n9-hit0-mainline-s0-d0.jsonl.gz";
    let bytes = std::fs::read(root.join(V1_CORPUS).join(name)).expect("corpus file");
    let text = kvgeom::trace::decompress(Path::new(name), &bytes).expect("gunzip");
    let text = String::from_utf8(text).expect("utf-8");
    let dir = scratch(module_path!(), "v1-read-refused");
    let mut edited = String::new();
    let mut raised = 0;
    for line in text.lines() {
        let mut e: Value = serde_json::from_str(line).expect("event");
        if e["ev"] == "request_done" && !e["exception"].is_null() {
            e["exception"] = Value::Null;
            raised += 1;
        }
        edited.push_str(&e.to_string());
        edited.push('\n');
    }
    assert_eq!(raised, 1, "the recorded read raised");
    let original = dir.join("raised.jsonl");
    std::fs::write(&original, text).expect("write");
    let went_through = dir.join("went-through.jsonl");
    std::fs::write(&went_through, edited).expect("write");
    let got = verdicts(
        &["diff-trace", "--policy", "vllm-0.33.0"],
        &[original, went_through],
    );
    assert_eq!(got["raised.jsonl"].0, "match", "{:?}", got["raised.jsonl"]);
    let (v, m) = &got["went-through.jsonl"];
    assert_eq!(v, "differ", "{m}");
    assert!(m.contains("the read: vLLM raised none"), "{m}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The truth script, run on the reproducers, gives their README's verdicts,
/// and on every committed file the truth.json it wrote.
#[test]
fn the_v1_truth_script_gives_the_reproducers_verdicts() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    if Command::new("python3")
        .arg("--version")
        .output()
        .map(|o| !o.status.success())
        .unwrap_or(true)
    {
        skip(
            "the_v1_truth_script_gives_the_reproducers_verdicts",
            "no python3",
        );
        return;
    }
    let manifest = truth_manifest(
        &root.join("tests/fixtures"),
        &[
            "vllm-0.33.0-v1-corpus".as_ref(),
            "vllm-0.33.0-v1-reproducers".as_ref(),
        ],
    );
    assert_eq!(
        Value::Object(v1_truth()),
        manifest,
        "truth.json is the script's output"
    );
    let readme =
        std::fs::read_to_string(root.join(V1_REPRODUCERS).join("README.md")).expect("README");
    // The table's columns by their headers: the file, then check-trace's
    // and diff-trace --policy vllm-0.33.0's verdicts.
    let mut columns: Option<(usize, usize)> = None;
    let mut rows = 0;
    for line in readme.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if cells.get(1) == Some(&"file") {
            let at = |header: &str| cells.iter().position(|c| *c == header);
            columns = Some((
                at("check-trace").expect("a check-trace column"),
                at("diff-trace --policy vllm-0.33.0").expect("a diff-trace --policy column"),
            ));
            continue;
        }
        let Some(file) = cells
            .get(1)
            .map(|c| c.trim_matches('`'))
            .filter(|c| c.ends_with(".jsonl"))
        else {
            continue;
        };
        let (check_at, diff_at) = columns.expect("the table's header before its rows");
        let got = &manifest[format!("vllm-0.33.0-v1-reproducers/{file}")];
        assert!(got.is_object(), "{file}: the script gives no verdict");
        let (readme_check, readme_diff) = (cells[check_at], cells[diff_at]);
        assert_eq!(
            (readme_check, readme_diff),
            (got["check"].as_str().unwrap(), got["diff"].as_str().unwrap()),
            "{file}: README says check-trace {readme_check}, diff-trace {readme_diff}; the script {got}"
        );
        rows += 1;
    }
    assert_eq!(rows, 3, "the README's table");
    // Planted in a passing reproducer: two attention pairs swapped, a
    // write into the prefix-hit block, two state parts swapped.
    let base = std::fs::read_to_string(
        root.join(V1_REPRODUCERS)
            .join("A1-mla-kda-16-4-prefix-tp1-tp1_N18-c1-mainline.jsonl"),
    )
    .expect("reproducer");
    let dir = scratch(module_path!(), "v1-truth");
    let plant = |name: &str, change: &dyn Fn(&mut Value)| -> PathBuf {
        let mut text = String::new();
        for line in base.lines() {
            let mut e: Value = serde_json::from_str(line).expect("event");
            if e["ev"] == "xfer" {
                change(&mut e);
            }
            text.push_str(&e.to_string());
            text.push('\n');
        }
        let path = dir.join(format!("{name}.jsonl"));
        std::fs::write(&path, text).expect("write");
        path
    };
    let swap = |e: &mut Value, which: &str, a: usize, b: usize| {
        let ids = e[which].as_array_mut().expect("ids");
        ids.swap(a, b);
    };
    let position = |e: &Value, id: u64| {
        e["local_ids"]
            .as_array()
            .and_then(|ids| ids.iter().position(|v| v.as_u64() == Some(id)))
            .expect("local id")
    };
    let planted = [
        plant("swapped-attention", &|e| swap(e, "remote_ids", 0, 1)),
        plant("into-the-hit", &|e| e["local_ids"][0] = 4.into()),
        plant("swapped-state", &|e| {
            let (a, b) = (position(e, 64), position(e, 88));
            swap(e, "remote_ids", a, b)
        }),
    ];
    let planted_paths: Vec<&Path> = planted.iter().map(PathBuf::as_path).collect();
    let manifest = truth_manifest(root, &planted_paths);
    for path in &planted {
        let got = &manifest[path.to_string_lossy().as_ref()];
        assert_eq!(got["check"], "violations", "{}: {got}", path.display());
    }
    assert_eq!(
        manifest[planted[0].to_string_lossy().as_ref()]["misaligned"],
        2
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn load(name: &str) -> Value {
    let bytes = std::fs::read(v2_trace(name)).expect("fixture");
    let mut text = Vec::new();
    flate2::read::GzDecoder::new(&bytes[..])
        .read_to_end(&mut text)
        .expect("gzip");
    serde_json::from_slice(&text).expect("JSON")
}

fn write(dir: &Path, name: &str, trace: &Value) -> PathBuf {
    let path = dir.join(format!("{name}.trace.json"));
    let mut f = std::fs::File::create(&path).expect("create");
    f.write_all(serde_json::to_string(trace).expect("encode").as_bytes())
        .expect("write");
    path
}

fn ids(x: &mut Value, which: &str) -> Vec<u64> {
    x[which]
        .as_array()
        .expect("ids")
        .iter()
        .map(|v| v.as_u64().expect("id"))
        .collect()
}

fn set_ids(x: &mut Value, which: &str, ids: Vec<u64>) {
    x[which] = Value::from(ids);
}

/// The remote list transfer 0 reads from, and its row of remote id `k`.
fn remote_row(trace: &mut Value, k: usize) -> &mut Value {
    let x = trace["result"]["xfers"][0].clone();
    let handle = x["remote"].as_u64().expect("handle");
    let agent = x["agent"].as_str().expect("agent").to_string();
    let id = x["remote_ids"][k].as_u64().expect("id") as usize;
    let lists = trace["result"]["dlists"].as_array_mut().expect("lists");
    let list = lists
        .iter_mut()
        .find(|d| d["agent"] == agent.as_str() && d["handle"] == handle)
        .expect("the remote list");
    &mut list["rows"][id]
}

type Mutation = (&'static str, fn(&mut Value));

/// Realistic bugs in vLLM's transfers, each harmful.
const MUTATIONS: &[Mutation] = &[
    ("a remote id shifted by one", |t| {
        let x = &mut t["result"]["xfers"][0];
        let mut r = ids(x, "remote_ids");
        r[0] += 1;
        set_ids(x, "remote_ids", r);
    }),
    ("a local id shifted by one", |t| {
        let x = &mut t["result"]["xfers"][0];
        let mut l = ids(x, "local_ids");
        l[0] += 1;
        set_ids(x, "local_ids", l);
    }),
    ("two remote ids swapped", |t| {
        let x = &mut t["result"]["xfers"][0];
        let mut r = ids(x, "remote_ids");
        r.swap(0, 1);
        set_ids(x, "remote_ids", r);
    }),
    ("a pair dropped", |t| {
        let x = &mut t["result"]["xfers"][0];
        let (mut l, mut r) = (ids(x, "local_ids"), ids(x, "remote_ids"));
        l.remove(0);
        r.remove(0);
        set_ids(x, "local_ids", l);
        set_ids(x, "remote_ids", r);
    }),
    (
        "a pair's destination written again from another source",
        |t| post_first_destination_again(t, 1),
    ),
    ("a local id beyond its list", |t| {
        let x = &mut t["result"]["xfers"][0];
        let mut l = ids(x, "local_ids");
        l[0] = 1 << 20;
        set_ids(x, "local_ids", l);
    }),
    ("a row one byte shorter", |t| {
        let row = remote_row(t, 0);
        row[1] = Value::from(row[1].as_u64().expect("len") - 1);
    }),
    ("a row's address moved by 4 bytes", |t| {
        let row = remote_row(t, 0);
        row[0] = Value::from(row[0].as_u64().expect("addr") + 4);
    }),
    ("a transfer lost", |t| {
        t["result"]["xfers"].as_array_mut().expect("xfers").pop();
    }),
];

/// Every mutation of a passing trace is caught by check-trace (with and
/// without memory images) and is a difference for diff-trace under vLLM
/// 0.33.0's policy, which matches the trace unmutated.
#[test]
fn planted_bugs_are_caught() {
    let dir = scratch(module_path!(), "mutants");
    for base in [
        "nemotron-h-gqa-mamba2-hnd-pull-n13-hit0-mainline-s0",
        "mla-kda-decode-tp2-pull-n13-hit0-mainline-s0",
        "mla-kda-equal-ppl-prefix-cache-pull-n37-hit16-mainline-s0",
        "mla-kda-equal-ppl-prefix-cache-push-n13-hit0-mainline-s0",
    ] {
        let original = load(base);
        for with_memory in [true, false] {
            let mut clean = original.clone();
            if !with_memory {
                clean.as_object_mut().expect("object").remove("memory");
            }
            let path = write(&dir, "clean", &clean);
            let (v, m, _) = verdict(&["check-trace"], &path);
            assert_eq!(v, "passed", "{base} unmutated: {m}");
            for &(what, mutate) in MUTATIONS {
                let mut t = clean.clone();
                mutate(&mut t);
                let path = write(&dir, "mutant", &t);
                let (v, m, _) = verdict(&["check-trace"], &path);
                assert_eq!(
                    v, "violations",
                    "{base} ({what}, memory {with_memory}): {m}"
                );
                let (v, m, _) = verdict(&["diff-trace", "--policy", "vllm-0.33.0"], &path);
                assert_eq!(v, "differ", "{base} ({what}): {m}");
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Appends to the first transfer a pair into its first pair's destination,
/// read from the source of its pair `source`.
fn post_first_destination_again(t: &mut Value, source: usize) {
    let x = &mut t["result"]["xfers"][0];
    let (mut l, mut r) = (ids(x, "local_ids"), ids(x, "remote_ids"));
    l.push(l[0]);
    r.push(r[source]);
    set_ids(x, "local_ids", l);
    set_ids(x, "remote_ids", r);
}

/// A pair posted twice writes the same bytes again: with the trace's memory
/// that is a redundant write (a cost, the trace passes); without it the
/// content is unknown and it stays a double write.
#[test]
fn a_pair_posted_twice_is_redundant_with_memory_and_unknown_without() {
    let dir = scratch(module_path!(), "posted-twice");
    let mut twice = load("nemotron-h-gqa-mamba2-hnd-pull-n13-hit0-mainline-s0");
    post_first_destination_again(&mut twice, 0);
    let (v, m, _) = verdict(&["check-trace"], &write(&dir, "with-memory", &twice));
    assert_eq!(v, "passed", "{m}");
    twice.as_object_mut().expect("object").remove("memory");
    let (v, m, _) = verdict(&["check-trace"], &write(&dir, "without-memory", &twice));
    assert_eq!(v, "violations", "{m}");
    assert!(m.contains("content unknown"), "{m}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Changes no oracle sees (the bytes are the same), which diff-trace
/// still reports.
const DIFF_ONLY: &[Mutation] = &[
    ("a list prepared with another memory type", |t| {
        let lists = t["result"]["dlists"].as_array_mut().expect("lists");
        let last = lists.last_mut().expect("a list");
        let other = if last["mem"] == "DRAM" {
            "VRAM"
        } else {
            "DRAM"
        };
        last["mem"] = Value::from(other);
    }),
    ("a list not prepared", |t| {
        let x = t["result"]["xfers"][0].clone();
        let lists = t["result"]["dlists"].as_array_mut().expect("lists");
        let unused = lists
            .iter()
            .position(|d| {
                d["agent"] == x["agent"] && d["handle"] != x["local"] && d["target"] == "local"
            })
            .expect("a local list no transfer 0 uses");
        lists.remove(unused);
    }),
];

#[test]
fn list_changes_are_differences() {
    let dir = scratch(module_path!(), "lists");
    let base = "nemotron-h-gqa-mamba2-hnd-pull-n13-hit0-mainline-s0";
    for &(what, mutate) in DIFF_ONLY {
        let mut t = load(base);
        mutate(&mut t);
        let path = write(&dir, "mutant", &t);
        let (v, m, _) = verdict(&["diff-trace", "--policy", "vllm-0.33.0"], &path);
        assert_eq!(v, "differ", "{what}: {m}");
        assert!(m.contains("list"), "{what}: {m}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The first post-process call of a trace.
fn first_call(t: &mut Value) -> &mut Value {
    &mut t["result"]["post_process_calls"][0]
}

/// Changes to vLLM's receive post-process calls, each a difference for
/// diff-trace (the bytes they would leave are judged by check-trace's
/// byte-level oracles, not here).
const POST_PROCESS: &[Mutation] = &[
    ("a call dropped", |t| {
        t["result"]["post_process_calls"]
            .as_array_mut()
            .expect("calls")
            .remove(0);
    }),
    ("a call made twice", |t| {
        let calls = t["result"]["post_process_calls"]
            .as_array_mut()
            .expect("calls");
        let first = calls[0].clone();
        calls.push(first);
    }),
    ("one sub-block fewer covered", |t| {
        let entry = &mut first_call(t)["block_ids_list"][0];
        entry[2] = Value::from(entry[2].as_u64().expect("covered") - 1);
    }),
    ("another block converted", |t| {
        let blocks = &mut first_call(t)["block_ids_list"][0][1];
        blocks[0] = Value::from(blocks[0].as_u64().expect("block") + 1);
    }),
    ("another ratio", |t| {
        let call = first_call(t);
        call["block_size_ratio"] =
            Value::from(call["block_size_ratio"].as_u64().expect("ratio") + 1);
    }),
    ("the conversion flag flipped", |t| {
        let call = first_call(t);
        call["convert"] = Value::from(!call["convert"].as_bool().expect("convert"));
    }),
    ("a zeroed range one byte shorter", |t| {
        let range = &mut first_call(t)["zeroed"][0];
        range[1] = Value::from(range[1].as_u64().expect("len") - 1);
    }),
    ("a zeroed range lost", |t| {
        first_call(t)["zeroed"]
            .as_array_mut()
            .expect("zeroed")
            .pop();
    }),
    ("a region-mapped zeroing", |t| {
        let agent = first_call(t)["agent"].clone();
        t["result"]["region_zero_calls"] =
            serde_json::json!([{"agent": agent, "region_block_ids": [[3]], "zeroed": null}]);
    }),
];

/// diff-trace compares every post-process call vLLM made (ratio, groups,
/// blocks, covered sub-blocks, conversion, zeroed byte ranges) with
/// kvgeom's: MLA with a ratio (tail zeroed), a GQA hybrid with a ratio
/// (converted), a ppl mismatch at equal kernel blocks (whole blocks zeroed).
#[test]
fn post_process_changes_are_differences() {
    let dir = scratch(module_path!(), "post-process");
    for base in [
        "g5-mla-kda-mixed-kernel-pull-n9-hit0-mainline-s0",
        "mamba2-replicated-groups-p4-d2-pull-n13-hit0-mainline-s0",
        "mla-kda-decode-tp2-pull-n13-hit0-mainline-s0",
    ] {
        let clean = load(base);
        let zeroed = clean["result"]["post_process_calls"][0]["zeroed"]
            .as_array()
            .map_or(0, Vec::len);
        assert!(zeroed > 0, "{base}: its first call zeroes nothing");
        for &(what, mutate) in POST_PROCESS {
            let mut t = clean.clone();
            mutate(&mut t);
            let path = write(&dir, "mutant", &t);
            let (v, m, _) = verdict(&["diff-trace", "--policy", "vllm-0.33.0"], &path);
            assert_eq!(v, "differ", "{base} ({what}): {m}");
            assert!(m.contains("post-process"), "{base} ({what}): {m}");
        }
    }
    // Not measured (a driver before it, or regions above its limit): the
    // rest of the call is still compared.
    let mut t = load("g5-mla-kda-mixed-kernel-pull-n9-hit0-mainline-s0");
    first_call(&mut t)["zeroed"] = Value::Null;
    let path = write(&dir, "unmeasured", &t);
    let (v, m, _) = verdict(&["diff-trace", "--policy", "vllm-0.33.0"], &path);
    assert_eq!(v, "match", "zeroed ranges not measured: {m}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Bad input is an error verdict naming what is wrong, never a panic.
#[test]
fn a_trace_that_does_not_rebuild_is_an_error() {
    let dir = scratch(module_path!(), "bad");
    let base = "nemotron-h-gqa-mamba2-hnd-pull-n13-hit0-mainline-s0";
    type Edit = (&'static str, fn(&mut Value));
    let edits: &[Edit] = &[
        ("case.decode is not what kvgeom prepares", |t| {
            t["case"]["decode"]["transfer_blocks"][0][0] = Value::from(5);
        }),
        ("not kvgeom-vllm-trace/2", |t| {
            t["format"] = Value::from("kvgeom-vllm-trace/9")
        }),
        ("not base64", |t| {
            t["memory"]["images"][0]["after"] = Value::from("@@@@")
        }),
        ("is not the memory kvgeom prepares", |t| {
            // The last image is decode's, which the transfer changed.
            let images = t["memory"]["images"].as_array_mut().expect("images");
            let last = images.last_mut().expect("an image");
            last["before"] = last["after"].clone();
        }),
        ("memory images of", |t| {
            t["memory"]["images"].as_array_mut().expect("images").pop();
        }),
        ("neither pull nor push", |t| {
            t["case"]["mode"] = Value::from("sideways")
        }),
        ("not valid", |t| {
            t["case"]["geometry"]["decode"]["tp_size"] = Value::from(0)
        }),
        ("unknown status", |t| {
            t["result"]["status"] = Value::from("maybe")
        }),
    ];
    for &(expected, edit) in edits {
        let mut t = load(base);
        edit(&mut t);
        let path = write(&dir, "bad", &t);
        for args in [&["check-trace"][..], &["diff-trace"][..]] {
            let (v, m, _) = verdict(args, &path);
            assert_eq!(v, "error", "{args:?} ({expected}): {m}");
            assert!(
                m.contains(expected),
                "{args:?}: {m:?} does not say {expected:?}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A fresh recording with vLLM's venv: the sweep saves one trace per case,
/// which check-trace passes and diff-trace matches under vLLM 0.33.0's
/// policy.
#[test]
fn a_live_sweep_records_traces_that_judge_as_its_cases() {
    if let Err(why) = kvgeom::live::find(None, kvgeom::under_test::Release::pinned().version) {
        skip(
            "a_live_sweep_records_traces_that_judge_as_its_cases",
            format_args!("no vLLM venv ({why})"),
        );
        return;
    }
    let dir = scratch(module_path!(), "record");
    let out = Command::new(env!("CARGO_BIN_EXE_kvgeom"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args([
            "sweep",
            "--connector",
            "vllm",
            "geometries/nemotron-h-gqa-mamba2-hnd.toml",
            "--prompts",
            "13",
            "--mode",
            "pull",
            "--alloc",
            "mainline",
            "--record-traces",
        ])
        .arg(&dir)
        .output()
        .expect("run kvgeom");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let file = dir.join("nemotron-h-gqa-mamba2-hnd-pull-n13-hit0-mainline-s0.trace.json.gz");
    let (v, m, _) = verdict(&["check-trace"], &file);
    assert_eq!(v, "passed", "{m}");
    let (v, m, _) = verdict(&["diff-trace", "--policy", "vllm-0.33.0"], &file);
    assert_eq!(v, "match", "{m}");
    // Beside it, decode rank 0's v1 trace of the same case.
    let v1 = dir.join("nemotron-h-gqa-mamba2-hnd-pull-n13-hit0-mainline-s0-d0.jsonl.gz");
    let mut text = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(&v1).expect("the v1 trace"))
        .read_to_string(&mut text)
        .expect("gzip");
    let events: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON event a line"))
        .collect();
    assert_eq!(events[0]["format"], "vllm-nixl-geometry-trace/1");
    assert_eq!(events[0]["params"]["d_rank"], 0);
    assert_eq!(events[0]["params"]["alloc"], "mainline");
    let evs: Vec<&str> = events.iter().map(|e| e["ev"].as_str().unwrap()).collect();
    for ev in [
        "register_memory",
        "local_geometry",
        "add_remote_agent",
        "request",
        "xfer",
    ] {
        assert!(evs.contains(&ev), "{ev} in {evs:?}");
    }
    assert_eq!(events.last().unwrap()["outcome"], "passed");
    // One case with explain, saved as plain JSON.
    let one = dir.join("one.trace.json");
    let out = Command::new(env!("CARGO_BIN_EXE_kvgeom"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args([
            "explain",
            "geometries/mla-kda-decode-tp2.toml",
            "--prompt",
            "9",
            "--connector",
            "vllm",
            "--record-trace",
        ])
        .arg(&one)
        .output()
        .expect("run kvgeom");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&one).expect("the trace");
    assert!(text.starts_with('{') && text.contains("kvgeom-vllm-trace/2"));
    let (v, m, _) = verdict(&["check-trace"], &one);
    assert_eq!(v, "passed", "{m}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `kvgeom ARGS` from the project root, its stdout as JSON (the status
/// is the caller's to check).
fn json_of(args: &[&str]) -> (Option<i32>, Value) {
    let out = Command::new(env!("CARGO_BIN_EXE_kvgeom"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(args)
        .output()
        .expect("run kvgeom");
    let json = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{args:?}: no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code(), json)
}

/// The check-trace verdict a sweep's case outcome is: a refusal the
/// geometry expects or not is `rejected`, a pass `passed`, the rest
/// (violations, a crash, a hang, a refusal missing) `violations`.
fn check_verdict_of(outcome: &Value) -> &'static str {
    match outcome["kind"].as_str() {
        Some("passed") => "passed",
        Some("expected_rejection" | "unexpected_rejection") => "rejected",
        _ => "violations",
    }
}

/// The trace file of a sweep case recorded into `dir`.
fn recorded_file(dir: &Path, case: &Value) -> PathBuf {
    dir.join(format!(
        "{}-{}-n{}-hit{}-{}-s{}.trace.json.gz",
        case["geometry"].as_str().expect("geometry"),
        case["mode"].as_str().expect("mode"),
        case["prompt_len"],
        case["prefix_hit"],
        case["allocation"].as_str().expect("allocation"),
        case["seed"]
    ))
}

/// Sweep `args` with kvgeom's connector recording into a fresh folder, then
/// judge every recorded trace with check-trace and replay them all with
/// `sweep --connector replay`: each verdict is the sweep's. Returns the
/// sweep's cases and the folder.
fn record_and_judge(name: &str, args: &[&str]) -> (Vec<Value>, PathBuf) {
    let dir = scratch(module_path!(), name);
    let traces = dir.join("traces");
    let traces_arg = traces.to_str().expect("a UTF-8 path");
    let mut sweep_args = vec!["sweep"];
    sweep_args.extend_from_slice(args);
    sweep_args.extend_from_slice(&["--format", "json", "--record-traces", traces_arg]);
    let (code, sweep) = json_of(&sweep_args);
    assert!(matches!(code, Some(0 | 1)), "{sweep_args:?}: exit {code:?}");
    let cases = sweep["cases"].as_array().expect("cases").clone();
    assert!(!cases.is_empty());
    let files = std::fs::read_dir(&traces)
        .expect("the traces folder")
        .count();
    assert_eq!(files, cases.len(), "one trace per case");
    for case in &cases {
        let file = recorded_file(&traces, case);
        let (v, m, _) = verdict(&["check-trace"], &file);
        assert_eq!(
            v,
            check_verdict_of(&case["outcome"]),
            "{}: {m}",
            file.display()
        );
        if v == "violations" && case["outcome"]["kind"] == "violations" {
            let n = case["violations"].as_array().expect("violations").len();
            assert!(
                m.starts_with(&format!("{n} violations")),
                "{}: {m}",
                file.display()
            );
        }
    }
    let (_, replayed) = json_of(&[
        "sweep",
        "--connector",
        "replay",
        "--format",
        "json",
        traces_arg,
    ]);
    let replayed = replayed["cases"].as_array().expect("cases").clone();
    assert_eq!(replayed.len(), cases.len());
    for case in &cases {
        let traced = replayed
            .iter()
            .find(|r| {
                [
                    "geometry",
                    "mode",
                    "prompt_len",
                    "prefix_hit",
                    "allocation",
                    "seed",
                ]
                .iter()
                .all(|k| r[*k] == case[*k])
            })
            .unwrap_or_else(|| panic!("no replay of {case}"));
        assert_eq!(traced["outcome"], case["outcome"], "{case}");
        assert_eq!(traced["passed"], case["passed"], "{case}");
        assert_eq!(traced["code_under_test"], case["code_under_test"], "{case}");
        let count = |c: &Value| c["violations"].as_array().map_or(0, Vec::len);
        assert_eq!(count(traced), count(case), "{case}");
    }
    (cases, dir)
}

/// kvgeom's own connector run as vLLM 0.33.0 (passes, crashes, expected
/// refusals and hangs among the cases): each recorded trace reads back
/// with check-trace's verdict for the sweep's case, and replays to the
/// same outcome.
#[test]
fn kvgeoms_recorded_traces_judge_as_its_sweep() {
    let (cases, dir) = record_and_judge(
        "kvgeom-vllm-policy",
        &[
            "geometries/nemotron-h-gqa-mamba2-hnd.toml",
            "geometries/reject-g1-prefix-caching.toml",
            "geometries/mla-kda-decode-tp2.toml",
            "--prompts",
            "13",
            "--policy",
            "vllm-0.33.0",
        ],
    );
    let kinds: std::collections::BTreeSet<&str> = cases
        .iter()
        .filter_map(|c| c["outcome"]["kind"].as_str())
        .collect();
    for kind in ["passed", "crashed", "expected_rejection"] {
        assert!(kinds.contains(kind), "no {kind} case among {kinds:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A defect the oracles catch (its sweep's cases fail with violations)
/// records traces that check-trace fails, with the same violations.
#[test]
fn a_caught_defect_records_traces_check_trace_fails() {
    let (cases, dir) = record_and_judge(
        "kvgeom-defect",
        &[
            "geometries/g1-mla-kda-ppl3-vs-2.toml",
            "--prompts",
            "13",
            "--defect",
            "remote-ids-local-ppl",
        ],
    );
    assert!(
        cases.iter().any(|c| c["outcome"]["kind"] == "violations"),
        "the defect is caught on some case"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `explain --record-trace FILE` writes a v3 trace naming what ran:
/// kvgeom's connector, its version and the policy it ran as; diff-trace
/// under that policy matches it, and check-trace agrees with explain's
/// exit status.
#[test]
fn an_explained_case_records_what_ran() {
    let dir = scratch(module_path!(), "kvgeom-explain");
    for (args, policy, status) in [
        (&["--policy", "vllm-0.33.0"][..], "vllm-0.33.0", "passed"),
        (
            &["--defect", "remote-ids-local-ppl"][..],
            "defect remote-ids-local-ppl",
            "violations",
        ),
    ] {
        let file = dir.join("case.trace.json");
        let out = Command::new(env!("CARGO_BIN_EXE_kvgeom"))
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .args([
                "explain",
                "geometries/g1-mla-kda-ppl3-vs-2.toml",
                "--prompt",
                "13",
            ])
            .args(args)
            .arg("--record-trace")
            .arg(&file)
            .output()
            .expect("run kvgeom");
        let expected_exit = if status == "passed" { 0 } else { 1 };
        assert_eq!(out.status.code(), Some(expected_exit), "{args:?}");
        let trace: Value =
            serde_json::from_slice(&std::fs::read(&file).expect("the trace")).expect("JSON");
        assert_eq!(trace["format"], "kvgeom-trace/3");
        assert_eq!(
            trace["code_under_test"],
            serde_json::json!({
                "connector": "kvgeom",
                "version": env!("CARGO_PKG_VERSION"),
                "policy": policy,
                "source": null,
            })
        );
        assert!(trace.get("vllm_version").is_none());
        assert!(
            trace["memory"]["images"].is_array(),
            "a small case holds its memory"
        );
        let (v, m, _) = verdict(&["check-trace"], &file);
        assert_eq!(v, status, "{args:?}: {m}");
        let mut diff = vec!["diff-trace"];
        diff.extend_from_slice(args);
        let (v, m, _) = verdict(&diff, &file);
        assert_eq!(v, "match", "{args:?}: {m}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A v3 trace is read as strictly as a v2 one: an unknown field, a
/// `vllm_version` beside `code_under_test`, or a v2 trace carrying
/// `code_under_test` is refused, naming the field.
#[test]
fn a_v3_trace_is_read_strictly() {
    let dir = scratch(module_path!(), "kvgeom-v3-strict");
    let file = dir.join("case.trace.json");
    let out = Command::new(env!("CARGO_BIN_EXE_kvgeom"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args([
            "explain",
            "geometries/g1-mla-kda-ppl3-vs-2.toml",
            "--prompt",
            "13",
        ])
        .arg("--record-trace")
        .arg(&file)
        .output()
        .expect("run kvgeom");
    assert_eq!(out.status.code(), Some(0));
    let trace: Value =
        serde_json::from_slice(&std::fs::read(&file).expect("the trace")).expect("JSON");
    let mut extra = trace.clone();
    extra["vllm_version"] = "0.33.0".into();
    let mut v2 = trace.clone();
    v2["format"] = "kvgeom-vllm-trace/2".into();
    v2["vllm_version"] = "0.33.0".into();
    let mut connector = trace.clone();
    connector["code_under_test"]["connector"] = "tgi".into();
    for (name, bad, field) in [
        ("extra", extra, "vllm_version"),
        ("v2", v2, "code_under_test"),
        ("connector", connector, "tgi"),
    ] {
        let path = dir.join(format!("{name}.trace.json"));
        std::fs::write(&path, bad.to_string()).expect("write");
        let (v, m, _) = verdict(&["check-trace"], &path);
        assert_eq!(v, "error", "{name}: {m}");
        assert!(m.contains(field), "{name}: {m}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Recording is refused where nothing would be recorded: a replayed trace
/// is already one.
#[test]
fn a_replay_records_no_trace() {
    let out = Command::new(env!("CARGO_BIN_EXE_kvgeom"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args([
            "sweep",
            "--connector",
            "replay",
            "--record-traces",
            "/nonexistent",
        ])
        .arg(v2_trace(
            "nemotron-h-gqa-mamba2-hnd-pull-n13-hit0-mainline-s0",
        ))
        .output()
        .expect("run kvgeom");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--record-traces"));
}

/// Every number of a trace's case and result set to 0, to one past
/// `u32::MAX` and to `u64::MAX` in turn, and every string emptied: each is
/// judged or refused with an error, never a panic.
#[test]
fn hostile_values_never_panic() {
    for base in [
        "mla-kda-decode-tp2-pull-n13-hit0-mainline-s0",
        "mla-kda-equal-ppl-prefix-cache-push-n13-hit0-mainline-s0",
    ] {
        hostile_values_of(base);
    }
}

/// The path of every number and string under `v`.
fn leaves(v: &Value, path: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                path.push(k.clone());
                leaves(x, path, out);
                path.pop();
            }
        }
        Value::Array(a) => {
            // The first two entries of each list stand for the rest.
            for (i, x) in a.iter().enumerate().take(2) {
                path.push(i.to_string());
                leaves(x, path, out);
                path.pop();
            }
        }
        Value::Number(_) | Value::String(_) => out.push(path.clone()),
        _ => {}
    }
}

/// The value at `path`.
fn at<'a>(v: &'a mut Value, path: &[String]) -> &'a mut Value {
    path.iter().fold(v, |v, k| match v {
        Value::Array(a) => &mut a[k.parse::<usize>().expect("index")],
        other => &mut other[k.as_str()],
    })
}

/// [`hostile_values_never_panic`] on one fixture, its memory images left out.
fn hostile_values_of(base: &str) {
    use kvgeom::trace::run_trace::{check_recorded, diff_recorded, RecordedCase};
    use kvgeom::variant::Variant;

    let mut trace = load(base);
    trace.as_object_mut().expect("object").remove("memory");
    let mut paths = Vec::new();
    leaves(&trace, &mut Vec::new(), &mut paths);
    let path = Path::new("hostile.trace.json");
    let mut judged = 0;
    for p in &paths {
        let replacements: Vec<Value> = if at(&mut trace.clone(), p).is_string() {
            vec![Value::from(""), Value::from("x")]
        } else {
            vec![
                Value::from(0),
                Value::from(1u64 << 32),
                Value::from(u64::MAX),
            ]
        };
        for r in replacements {
            let mut t = trace.clone();
            *at(&mut t, p) = r;
            let text = serde_json::to_vec(&t).expect("encode");
            if let Ok(rc) = RecordedCase::parse(path, &text) {
                judged += 1;
                let _ = check_recorded(&rc);
                let _ = diff_recorded(&rc, Variant::KVGEOM);
            }
        }
    }
    assert!(paths.len() > 50, "{base}: {} leaves", paths.len());
    assert!(judged > 0, "{base}: every change was refused");
}

/// The events of a gzipped v1 trace.
fn v1_events(path: &Path) -> Vec<Value> {
    let mut text = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(path).expect("a v1 trace"))
        .read_to_string(&mut text)
        .expect("gzip");
    text.lines()
        .map(|l| serde_json::from_str(l).expect("one JSON event a line"))
        .collect()
}

#[test]
fn v1_corpus_handshakes_state_the_prefill_blocks_its_geometry_has() {
    // vLLM's decode rewrites a larger prefill block into several of its own
    // kernel block during the handshake; the recorded metadata must be what
    // prefill sent, so the v1 file describes the prefill that ran (the
    // geometry of the case's v2 trace), on every file with a v2 sibling.
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(V1_CORPUS);
    let mut checked = 0;
    let mut larger_prefill_kernel = 0;
    for entry in std::fs::read_dir(&dir).expect("the corpus") {
        let path = entry.expect("an entry").path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let Some(stem) = name.strip_suffix(".jsonl.gz") else {
            continue;
        };
        let Some((case, _rank)) = stem.rsplit_once("-d") else {
            continue;
        };
        let v2 = dir.join(format!("{case}.trace.json.gz"));
        if !v2.exists() {
            continue;
        }
        let mut text = Vec::new();
        flate2::read::GzDecoder::new(std::fs::File::open(&v2).expect("a v2 trace"))
            .read_to_end(&mut text)
            .expect("gzip");
        let v2: Value = serde_json::from_slice(&text).expect("JSON");
        let prefill = &v2["case"]["geometry"]["prefill"];
        let (kernel, logical) = (
            prefill["kernel_block"].as_u64().expect("kernel_block"),
            prefill["logical_block"].as_u64().expect("logical_block"),
        );
        let events = v1_events(&path);
        let decode_kernel = events
            .iter()
            .find(|e| e["ev"] == "case")
            .map(|e| e["args"]["kernel"].as_u64().expect("kernel"))
            .expect("a case event");
        for e in events.iter().filter(|e| e["ev"] == "add_remote_agent") {
            let meta = &e["remote_meta"];
            let block = meta["block_size"].as_u64().expect("block_size");
            let ppl = meta["physical_blocks_per_logical_kv_block"]
                .as_u64()
                .expect("ppl");
            assert_eq!(
                (block, block * ppl),
                (kernel, logical),
                "{name}: the handshake states prefill blocks of {block} x {ppl}, its geometry has kernel {kernel}, logical {logical}"
            );
        }
        checked += 1;
        if kernel > decode_kernel {
            larger_prefill_kernel += 1;
        }
    }
    assert!(checked >= 20, "only {checked} v1 files with a v2 sibling");
    assert!(
        larger_prefill_kernel > 0,
        "no case with a prefill kernel block larger than decode's: the rewrite goes unchecked"
    );
}

/// `scripts/v1-trace-truth.py --manifest ARGS...` run in `dir`: its JSON
/// manifest (the script must succeed).
fn truth_manifest(dir: &Path, args: &[&Path]) -> Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/v1-trace-truth.py");
    let out = Command::new("python3")
        .current_dir(dir)
        .arg(script)
        .arg("--manifest")
        .args(args)
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the manifest")
}

/// Every fixture's v2 trace, in name order.
fn all_fixtures() -> Vec<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(FIXTURES);
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("fixtures")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.to_string_lossy().ends_with(".trace.json.gz"))
        .collect();
    paths.sort();
    paths
}

/// The reports of the replay connector (`trace::run_trace`) on `paths`,
/// each record judged by the one judge.
fn replayed(paths: &[PathBuf]) -> Vec<kvgeom::scenario::CaseReport> {
    use kvgeom::trace::run_trace::ReplayConnector;
    use kvgeom::under_test::{judge, ConnectorUnderTest};
    let connector = ReplayConnector::open(paths).expect("the traces read");
    let cases = connector.cases();
    let placed = connector.place(&cases);
    assert!(placed.iter().all(Result::is_ok), "every traced case places");
    connector
        .run(&cases, placed, &|record| judge(&record))
        .expect("the traces replay")
}

/// A recorded trace replayed as a connector under test and judged by the
/// one judge gives the verdict check-trace gives, violation by violation.
#[test]
fn a_replayed_trace_is_judged_as_check_trace_judges_it() {
    use kvgeom::scenario::Outcome;
    use kvgeom::trace::run_trace::{check_recorded, RecordedCase, RecordedCheck};
    let paths = all_fixtures();
    assert_eq!(paths.len(), 16, "the v2 fixtures");
    let reports = replayed(&paths);
    assert_eq!(reports.len(), paths.len());
    let (mut passed, mut failed, mut rejected) = (0, 0, 0);
    for (path, report) in paths.iter().zip(&reports) {
        let name = path.display();
        let rc = RecordedCase::read(path).expect("reads");
        match check_recorded(&rc).expect("checks") {
            RecordedCheck::Passed { bytes_checked } => {
                assert!(bytes_checked, "{name}: the fixtures hold memory");
                assert_eq!(report.outcome, Outcome::Passed, "{name}");
                assert!(report.violations.is_empty(), "{name}");
                passed += 1;
            }
            RecordedCheck::Rejected { message, expected } => {
                match (&report.outcome, expected) {
                    (Outcome::ExpectedRejection { message: m, .. }, true)
                    | (Outcome::UnexpectedRejection { message: m, .. }, false) => {
                        assert_eq!(*m, message, "{name}")
                    }
                    (other, _) => panic!("{name}: check-trace rejected, replay says {other:?}"),
                }
                rejected += 1;
            }
            RecordedCheck::Failed { findings } => {
                assert!(!report.passed(), "{name}: check-trace failed it");
                for v in &report.violations {
                    assert!(
                        findings.contains(&v.to_string()),
                        "{name}: replay's violation {v} is not check-trace's"
                    );
                }
                let outcome_lines = findings
                    .iter()
                    .filter(|f| !report.violations.iter().any(|v| v.to_string() == **f))
                    .count();
                assert!(outcome_lines <= 1, "{name}: {findings:?}");
                failed += 1;
            }
        }
    }
    // The pinned verdicts of the fixtures (every_fixture_has_its_pinned_verdicts).
    assert_eq!((passed, failed, rejected), (8, 7, 1));
}

/// A run record tampered with (one remote id of a passing trace moved to
/// another row of its list, its memory images kept) is judged a violation
/// by the replay connector and the one judge.
#[test]
fn a_tampered_replayed_record_is_a_violation() {
    let dir = scratch(module_path!(), "replay-tampered");
    let base = "mla-kda-decode-tp2-pull-n13-hit0-mainline-s0";
    let clean = write(&dir, "clean", &load(base));
    let mut t = load(base);
    let x = &mut t["result"]["xfers"][0];
    let mut r = ids(x, "remote_ids");
    let last = *r.last().expect("ids");
    assert_ne!(r[0], last, "{base}: transfer 0 reads more than one row");
    r[0] = last;
    set_ids(x, "remote_ids", r);
    let tampered = write(&dir, "tampered", &t);
    let reports = replayed(&[clean, tampered]);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(reports[0].passed(), "{base}: {:?}", reports[0].outcome);
    assert_eq!(
        reports[1].outcome,
        kvgeom::scenario::Outcome::Violations,
        "{base} tampered"
    );
    assert!(!reports[1].violations.is_empty());
}

/// Replayed traces run as any sweep does: on a chosen number of threads,
/// in shards that `report merge` puts back together as the whole run (the
/// connector named), and held to an expectations file by the judge (vLLM
/// 0.33.0's, which these traces of it meet; an entry naming another
/// outcome is a disagreement).
#[test]
fn replayed_traces_shard_merge_and_meet_expectations() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(FIXTURES);
    let d = scratch(module_path!(), "replay-shards");
    let fixtures = dir.to_str().expect("a UTF-8 path");
    let sweep = |extra: &[&str]| {
        let mut args = vec!["sweep", "--connector", "replay", "--format", "json"];
        args.extend_from_slice(extra);
        args.push(fixtures);
        crate::support::kvgeom(&args)
    };
    let whole = sweep(&["--threads", "1"]);
    assert_eq!(
        whole.status.code(),
        Some(1),
        "{}",
        crate::support::text(&whole)
    );
    let whole = crate::support::json_report(&whole);
    let mut shards = Vec::new();
    for k in 1..=2 {
        let out = d.join(format!("s{k}.json"));
        let shard = format!("{k}/2");
        let run = sweep(&[
            "--shard",
            &shard,
            "--threads",
            "2",
            "--out",
            out.to_str().unwrap(),
        ]);
        assert!(
            crate::support::text(&run).contains(&format!("shard {k}/2: 8 of 16 traces")),
            "{}",
            crate::support::text(&run)
        );
        shards.push(out);
    }
    let merged = d.join("merged.json");
    let merge = crate::support::kvgeom(&[
        "report",
        "merge",
        shards[0].to_str().unwrap(),
        shards[1].to_str().unwrap(),
        "--out",
        merged.to_str().unwrap(),
    ]);
    assert_eq!(
        merge.status.code(),
        Some(1),
        "{}",
        crate::support::text(&merge)
    );
    let merged: Value =
        serde_json::from_str(&std::fs::read_to_string(&merged).expect("merged")).expect("JSON");
    assert_eq!(merged["connector"], "replay");
    assert_eq!(merged["cases"], whole["cases"]);
    assert_eq!(merged["code_under_test"], whole["code_under_test"]);

    let expected = sweep(&["--expect", "expected/vllm-0.33.0.toml"]);
    assert_eq!(
        expected.status.code(),
        Some(0),
        "{}",
        crate::support::text(&expected)
    );
    assert!(crate::support::text(&expected).contains("7 of 16 cases failed, each as expected"));
    // One failing trace listed with another outcome: the judge disagrees.
    let wrong = d.join("wrong.toml");
    let listed = std::fs::read_to_string("expected/vllm-0.33.0.toml").expect("expectations");
    let crashed = "geometry = \"nemotron-h-gqa-mamba2-hnd\"\nmode = \"push\"";
    assert!(listed.contains(crashed), "the fixture's entry moved");
    std::fs::write(
        &wrong,
        listed.replace(
            &format!("{crashed}\ncases = \"all\"\noutcome = \"crashed\""),
            &format!("{crashed}\ncases = \"all\"\noutcome = \"hung\""),
        ),
    )
    .expect("write");
    let disagrees = sweep(&["--expect", wrong.to_str().unwrap()]);
    assert_eq!(disagrees.status.code(), Some(1));
    assert!(
        crate::support::text(&disagrees)
            .contains("nemotron-h-gqa-mamba2-hnd N=13 h=0 push mainline"),
        "{}",
        crate::support::text(&disagrees)
    );
    let _ = std::fs::remove_dir_all(&d);
}

/// `kvgeom sweep --connector replay FOLDER` judges every fixture as
/// `check-trace` does (passed, failed, or refused), exits 1 since some
/// fail, and `explain --connector replay` shows one.
#[test]
fn sweep_and_explain_replay_recorded_traces() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(FIXTURES);
    let out = Command::new(env!("CARGO_BIN_EXE_kvgeom"))
        .args(["sweep", "--connector", "replay", "--format", "json"])
        .arg(&dir)
        .output()
        .expect("run kvgeom");
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).expect("a JSON report");
    assert_eq!(report["connector"], "replay");
    let cases = report["cases"].as_array().expect("cases");
    let paths = all_fixtures();
    assert_eq!(cases.len(), paths.len());
    for (case, path) in cases.iter().zip(&paths) {
        let (v, m, _) = verdict(&["check-trace"], path);
        let kind = case["outcome"]["kind"].as_str().expect("an outcome");
        let expected: &[&str] = match v.as_str() {
            "passed" => &["passed"],
            "rejected" => &["expected_rejection"],
            "violations" | "failed" => &[
                "violations",
                "crashed",
                "hung",
                "missing_rejection",
                "unexpected_rejection",
            ],
            other => panic!("{}: check-trace {other}: {m}", path.display()),
        };
        assert!(
            expected.contains(&kind),
            "{}: check-trace {v}, replay {kind}",
            path.display()
        );
    }
    let one = v2_trace("mla-kda-decode-tp2-pull-n13-hit0-mainline-s0");
    let explain = |prompt: &str| {
        Command::new(env!("CARGO_BIN_EXE_kvgeom"))
            .args(["explain", "--connector", "replay"])
            .arg(&one)
            .args(["--prompt", prompt])
            .output()
            .expect("run kvgeom")
    };
    let shown = explain("13");
    assert_eq!(shown.status.code(), Some(0));
    let text = String::from_utf8_lossy(&shown.stdout);
    assert!(
        text.contains("outcome: passed") && text.contains("pair: Read"),
        "{text}"
    );
    let other = explain("12");
    assert_eq!(other.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&other.stderr).contains("records --prompt 13"));
}
