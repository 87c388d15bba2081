//! `check-trace` and `diff-trace` on hostile or broken traces: every bad
//! file is an error verdict of its own (never a panic), decompressed input
//! and numbers are bounded, folders are searched recursively, and the
//! `--format json` verdict report.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use kvgeom::trace::{TraceCase, TraceErrorKind};
use serde_json::Value;

const GOOD: &str = "test_hetero_ppl_token_alignment_sweep_25-12-8.jsonl.gz";

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/vllm-0.33.0")
        .join(name)
}

/// A fresh folder for one test.
fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "kvgeom-trace-robustness-{}-{test}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The good fixture's events, one JSON object per line.
fn good_lines() -> Vec<Value> {
    let bytes = std::fs::read(fixture(GOOD)).unwrap();
    let text = kvgeom::trace::decompress(Path::new(GOOD), &bytes).unwrap();
    String::from_utf8(text)
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Write the good trace to `path` with `edit` applied to every event.
fn write_edited(path: &Path, edit: impl Fn(&mut Value)) {
    let mut text = String::new();
    for mut line in good_lines() {
        edit(&mut line);
        text.push_str(&line.to_string());
        text.push('\n');
    }
    std::fs::write(path, text).unwrap();
}

/// An editor setting `field` (a `/`-separated pointer) of every `ev` event.
fn set(ev: &'static str, pointer: &'static str, value: Value) -> impl Fn(&mut Value) {
    move |line: &mut Value| {
        if line["ev"] == ev {
            *line.pointer_mut(pointer).expect("field exists") = value.clone();
        }
    }
}

fn kvgeom(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kvgeom"))
        .args(args)
        .output()
        .expect("kvgeom runs")
}

fn json_report(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    })
}

/// The four zero divisors diff-trace used to panic on, each with the field
/// its error must name.
fn zero_divisors(dir: &Path) -> Vec<(PathBuf, &'static str)> {
    let cases = [
        (
            "ppl0.jsonl",
            set(
                "add_remote_agent",
                "/remote_meta/physical_blocks_per_logical_kv_block",
                0.into(),
            ),
            "physical_blocks_per_logical_kv_block",
        ),
        (
            "block0.jsonl",
            set("add_remote_agent", "/remote_meta/block_size", 0.into()),
            "block_size",
        ),
        (
            "tp0.jsonl",
            set("add_remote_agent", "/args/remote_tp_size", 0.into()),
            "remote_tp_size",
        ),
        (
            "kernel0.jsonl",
            set("make_worker", "/args/kernel_block_size", 0.into()),
            "kernel_block_size",
        ),
    ];
    cases
        .into_iter()
        .map(|(name, edit, field)| {
            let path = dir.join(name);
            write_edited(&path, edit);
            (path, field)
        })
        .collect()
}

#[test]
fn zero_divisors_are_errors_of_their_file_and_the_folder_run_goes_on() {
    let dir = scratch("zero");
    let bad = zero_divisors(&dir);
    // The good trace sorts after every bad one: a panic would lose it.
    std::fs::copy(fixture(GOOD), dir.join("zz-good.jsonl.gz")).unwrap();
    for (path, field) in &bad {
        let err = TraceCase::read(path).unwrap_err();
        assert!(
            matches!(err.kind, TraceErrorKind::ZeroField { field: f, .. } if f == *field),
            "{err}"
        );
    }
    let o = kvgeom(&["diff-trace", dir.to_str().unwrap(), "--format", "json"]);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    assert!(!String::from_utf8_lossy(&o.stderr).contains("panicked"));
    let report = json_report(&o);
    assert_eq!(report["schema"], "kvgeom-trace-verdicts/1");
    let s = &report["summary"];
    assert_eq!(
        (&s["files"], &s["passed"], &s["failed"], &s["error"]),
        (&5.into(), &1.into(), &0.into(), &4.into()),
        "{report}"
    );
    let files = report["files"].as_array().unwrap();
    assert_eq!(files[4]["verdict"], "match");
    assert!(files[4]["file"]
        .as_str()
        .unwrap()
        .ends_with("zz-good.jsonl.gz"));
    for (path, field) in &bad {
        let entry = files
            .iter()
            .find(|f| f["file"] == path.to_str().unwrap())
            .unwrap_or_else(|| panic!("{} missing: {report}", path.display()));
        assert_eq!(entry["verdict"], "error");
        let message = entry["message"].as_str().unwrap();
        assert!(
            message.contains(field) && message.contains("is 0"),
            "{message}"
        );
    }
    // The text format says the same: an error per bad file, then the match.
    let o = kvgeom(&["diff-trace", dir.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    let stdout = String::from_utf8_lossy(&o.stdout);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stdout.contains("zz-good.jsonl.gz: MATCH"), "{stdout}");
    assert!(stdout.contains("1 match, 0 differ"), "{stdout}");
    assert_eq!(stderr.matches("error: ").count(), 4, "{stderr}");
    // check-trace refuses them too, and still checks the good one.
    let o = kvgeom(&["check-trace", dir.to_str().unwrap(), "--format", "json"]);
    assert_eq!(o.status.code(), Some(2));
    let report = json_report(&o);
    assert_eq!(report["summary"]["passed"], 1, "{report}");
    assert_eq!(report["summary"]["error"], 4, "{report}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn ids_and_counts_that_do_not_fit_are_errors_not_truncated() {
    let dir = scratch("ids");
    let too_big = (1u64 << 32) + 1;
    let path = dir.join("local.jsonl");
    write_edited(&path, |line| {
        if line["ev"] == "request" {
            line["local_block_ids"][0][0] = too_big.into();
        }
    });
    let err = TraceCase::read(&path).unwrap_err();
    assert!(
        matches!(err.kind, TraceErrorKind::OutOfRange { field: "local_block_ids", value, .. } if value == too_big),
        "{err}"
    );
    assert!(err.to_string().contains("4294967297"), "{err}");
    let path = dir.join("computed.jsonl");
    write_edited(&path, |line| {
        if line["ev"] == "request" {
            line["local_num_computed_blocks"][0] = too_big.into();
        }
    });
    let err = TraceCase::read(&path).unwrap_err();
    assert!(
        matches!(
            err.kind,
            TraceErrorKind::OutOfRange {
                field: "local_num_computed_blocks",
                ..
            }
        ),
        "{err}"
    );
    // An id that fits 32 bits but lies outside P's pool of 10 logical blocks.
    let path = dir.join("remote.jsonl");
    write_edited(&path, |line| {
        if line["ev"] == "request" {
            line["remote_block_ids"][0][1] = (1u64 << 31).into();
        }
    });
    let err = TraceCase::read(&path).unwrap_err();
    assert!(
        matches!(
            err.kind,
            TraceErrorKind::BlockOutOfPool {
                field: "remote_block_ids",
                blocks: 10,
                ..
            }
        ),
        "{err}"
    );
    let path = dir.join("tp.jsonl");
    write_edited(&path, set("make_worker", "/args/tp_size", 5000.into()));
    let err = TraceCase::read(&path).unwrap_err();
    assert!(
        matches!(
            err.kind,
            TraceErrorKind::OutOfRange {
                field: "tp_size",
                value: 5000,
                limit: 1024,
                ..
            }
        ),
        "{err}"
    );
    for cmd in ["diff-trace", "check-trace"] {
        let o = kvgeom(&[cmd, dir.to_str().unwrap(), "--format", "json"]);
        assert_eq!(o.status.code(), Some(2), "{cmd}");
        assert_eq!(json_report(&o)["summary"]["error"], 4, "{cmd}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_gzip_bomb_stops_at_the_input_limit() {
    let dir = scratch("bomb");
    // One member of 1 MiB of blanks, repeated: a few KiB on disk, one MiB
    // past the cap once inflated.
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    enc.write_all(&vec![b' '; 1 << 20]).unwrap();
    let member = enc.finish().unwrap();
    let members = (kvgeom::limits::MAX_INPUT_BYTES >> 20) + 1;
    let path = dir.join("bomb.jsonl.gz");
    std::fs::write(&path, member.repeat(members as usize)).unwrap();
    assert!(std::fs::metadata(&path).unwrap().len() < 1 << 20);
    let err = TraceCase::read(&path).unwrap_err();
    assert!(
        matches!(err.kind, TraceErrorKind::InflatesTooLarge { limit } if limit == kvgeom::limits::MAX_INPUT_BYTES),
        "{err}"
    );
    let message = err.to_string();
    assert!(
        message.contains("bomb.jsonl.gz")
            && message.contains("input limit of 67108864 bytes once decompressed"),
        "{message}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn folders_are_searched_recursively_and_an_empty_one_is_named() {
    let dir = scratch("folders");
    std::fs::create_dir_all(dir.join("a/deep")).unwrap();
    std::fs::create_dir_all(dir.join("empty/inner")).unwrap();
    std::fs::write(dir.join("empty/inner/notes.txt"), "not a trace").unwrap();
    std::fs::copy(fixture(GOOD), dir.join("a/deep/one.jsonl.gz")).unwrap();
    std::fs::copy(fixture(GOOD), dir.join("b.jsonl.gz")).unwrap();
    #[cfg(unix)]
    std::os::unix::fs::symlink("..", dir.join("a/deep/loop")).unwrap();
    let tree = dir.join("a");
    let o = kvgeom(&[
        "check-trace",
        tree.to_str().unwrap(),
        dir.join("b.jsonl.gz").to_str().unwrap(),
        "--format",
        "json",
    ]);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    let report = json_report(&o);
    let names: Vec<&str> = report["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["file"].as_str().unwrap())
        .collect();
    // The link from `a/deep` back to `a` is not followed round again.
    assert_eq!(names.len(), 2, "{names:?}");
    assert!(names[0].ends_with("a/deep/one.jsonl.gz"), "{names:?}");
    assert!(names[1].ends_with("b.jsonl.gz"), "{names:?}");
    assert_eq!(report["summary"]["passed"], 2, "{report}");
    for empty in [dir.join("empty"), dir.join("empty/inner")] {
        let o = kvgeom(&["diff-trace", empty.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(2));
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(
            stderr.contains(empty.to_str().unwrap())
                && stderr.contains("no *.jsonl or *.jsonl.gz trace files"),
            "{stderr}"
        );
        assert!(!stderr.contains("no trace given"), "{stderr}");
    }
    // In a run with other inputs the empty folder is one error verdict.
    let o = kvgeom(&[
        "diff-trace",
        dir.join("empty").to_str().unwrap(),
        dir.join("b.jsonl.gz").to_str().unwrap(),
        "--format",
        "json",
    ]);
    assert_eq!(o.status.code(), Some(2));
    let report = json_report(&o);
    assert_eq!(report["files"][0]["verdict"], "error");
    assert_eq!(
        report["files"][0]["file"],
        dir.join("empty").to_str().unwrap()
    );
    assert_eq!(report["files"][1]["verdict"], "match");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn json_verdicts_and_exit_statuses() {
    let dir = scratch("verdicts");
    let good = dir.join("good.jsonl.gz");
    std::fs::copy(fixture(GOOD), &good).unwrap();
    // vLLM read P's first two kernel blocks in the other order.
    let swapped = dir.join("swapped.jsonl");
    write_edited(&swapped, |line| {
        if line["ev"] == "xfer" && line["handle"] == 6 {
            let ids = line["remote_ids"].as_array_mut().unwrap();
            ids.swap(0, 1);
        }
    });
    // vLLM refused rank 1's handshake.
    let refused = dir.join("refused.jsonl");
    write_edited(&refused, |line| {
        if line["ev"] == "add_remote_agent" && line["args"]["remote_tp_rank"] == 1 {
            line["exception"] = "RuntimeError: incompatible block sizes".into();
        }
    });
    let run = |cmd: &str, file: &Path| {
        let o = kvgeom(&[cmd, file.to_str().unwrap(), "--format", "json"]);
        let report = json_report(&o);
        assert_eq!(report["summary"]["files"], 1, "{report}");
        let entry = report["files"][0].clone();
        assert_eq!(entry["file"], file.to_str().unwrap());
        assert_eq!(entry["explained_by"], Value::Null);
        (o.status.code(), entry, report["summary"].clone())
    };
    let (code, entry, summary) = run("diff-trace", &good);
    assert_eq!((code, &entry["verdict"]), (Some(0), &"match".into()));
    assert_eq!(summary["passed"], 1);
    let (code, entry, summary) = run("diff-trace", &swapped);
    assert_eq!((code, &entry["verdict"]), (Some(1), &"differ".into()));
    assert_eq!(summary["failed"], 1);
    assert!(
        entry["message"]
            .as_str()
            .unwrap()
            .contains("xfer #0 pair 0"),
        "{entry}"
    );
    let (code, entry, summary) = run("check-trace", &good);
    assert_eq!((code, &entry["verdict"]), (Some(0), &"passed".into()));
    assert_eq!(summary["passed"], 1);
    let (code, entry, summary) = run("check-trace", &swapped);
    assert_eq!((code, &entry["verdict"]), (Some(1), &"violations".into()));
    assert_eq!(summary["failed"], 1);
    assert!(
        entry["message"].as_str().unwrap().contains("[pairing]"),
        "{entry}"
    );
    let (code, entry, summary) = run("check-trace", &refused);
    assert_eq!((code, &entry["verdict"]), (Some(0), &"rejected".into()));
    assert_eq!(summary["rejected"], 1);
    assert!(
        entry["message"]
            .as_str()
            .unwrap()
            .contains("incompatible block sizes"),
        "{entry}"
    );
    let missing = dir.join("missing.jsonl");
    for cmd in ["diff-trace", "check-trace"] {
        let (code, entry, summary) = run(cmd, &missing);
        assert_eq!((code, &entry["verdict"]), (Some(2), &"error".into()));
        assert_eq!(summary["error"], 1);
    }
    // Text stays the default, with its summary line.
    let o = kvgeom(&["check-trace", good.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("good.jsonl.gz: OK") && stdout.contains("1 passed, 0 failed"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn state_regions_of_a_trace_rebuild_as_state_slots_or_are_named() {
    let dir = scratch("state-regions");
    let verdict = |path: &Path| -> (Option<i32>, Value) {
        let out = kvgeom(&["diff-trace", path.to_str().unwrap(), "--format", "json"]);
        (out.status.code(), json_report(&out)["files"][0].clone())
    };
    // Regions 0 and 1 hold state, as in every fixture: the trace matches.
    let whole = dir.join("whole.jsonl");
    write_edited(&whole, |_| {});
    assert_eq!(verdict(&whole).1["verdict"], "match");
    // State in region 0 only (one state slot): kvgeom then lists state for
    // region 0 alone, which the recorded lists (state in both) do not show.
    let first = dir.join("first.jsonl");
    write_edited(
        &first,
        set(
            "local_geometry",
            "/geometry/_ssm_region_indices",
            serde_json::json!([0]),
        ),
    );
    let (code, file) = verdict(&first);
    assert_eq!(
        (code, file["verdict"].as_str()),
        (Some(1), Some("differ")),
        "{file}"
    );
    // State in region 1 only is not a leading run: an error naming it.
    let second = dir.join("second.jsonl");
    write_edited(
        &second,
        set(
            "local_geometry",
            "/geometry/_ssm_region_indices",
            serde_json::json!([1]),
        ),
    );
    let (code, file) = verdict(&second);
    assert_eq!(code, Some(2));
    let message = file["message"].as_str().unwrap();
    assert!(
        message.contains(
            "mamba state in regions [1]: kvgeom's format states a leading run of layer slots"
        ),
        "{message}"
    );
}
