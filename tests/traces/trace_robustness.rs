//! `check-trace` and `diff-trace` on hostile or broken traces: every bad
//! file is an error verdict of its own (never a panic), decompressed input
//! and numbers are bounded, folders are searched recursively, and the
//! `--format json` verdict report.

use std::io::Write;
use std::path::{Path, PathBuf};

use kvgeom::trace::{TraceCase, TraceErrorKind};
use serde_json::Value;

use crate::support::{json_report, kvgeom, scratch, trace_lines, v1_trace};

const GOOD: &str = "test_hetero_ppl_token_alignment_sweep_25-12-8.jsonl.gz";

/// Write the good trace to `path` with `edit` applied to every event.
fn write_edited(path: &Path, edit: impl Fn(&mut Value)) {
    let mut text = String::new();
    for mut line in trace_lines(&v1_trace(GOOD)) {
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
    let dir = scratch(module_path!(), "zero");
    let bad = zero_divisors(&dir);
    // The good trace sorts after every bad one: a panic would lose it.
    std::fs::copy(v1_trace(GOOD), dir.join("zz-good.jsonl.gz")).unwrap();
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
    let dir = scratch(module_path!(), "ids");
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
    let dir = scratch(module_path!(), "bomb");
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
    let dir = scratch(module_path!(), "folders");
    std::fs::create_dir_all(dir.join("a/deep")).unwrap();
    std::fs::create_dir_all(dir.join("empty/inner")).unwrap();
    std::fs::write(dir.join("empty/inner/notes.txt"), "not a trace").unwrap();
    std::fs::copy(v1_trace(GOOD), dir.join("a/deep/one.jsonl.gz")).unwrap();
    std::fs::copy(v1_trace(GOOD), dir.join("b.jsonl.gz")).unwrap();
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
    let dir = scratch(module_path!(), "verdicts");
    let good = dir.join("good.jsonl.gz");
    std::fs::copy(v1_trace(GOOD), &good).unwrap();
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
    let dir = scratch(module_path!(), "state-regions");
    let verdict = |path: &Path| -> (Option<i32>, Value) {
        let out = kvgeom(&["diff-trace", path.to_str().unwrap(), "--format", "json"]);
        (out.status.code(), json_report(&out)["files"][0].clone())
    };
    // Regions 0 and 1 hold state, as in every fixture: the trace matches.
    let whole = dir.join("whole.jsonl");
    write_edited(&whole, |_| {});
    assert_eq!(verdict(&whole).1["verdict"], "match");
    // State in region 0 only (one state slot): kvgeom's model then registers
    // state for region 0 alone, which vLLM's own list (state in both) does
    // not show: the model is not the traced one, and the trace is refused.
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
        (Some(2), Some("error")),
        "{file}"
    );
    let message = file["message"].as_str().unwrap();
    assert!(
        message.contains("refused: the model kvgeom rebuilds from the trace's sizes")
            && message
                .contains("dlist #0 (local, target NIXL_INIT_AGENT): expected 140 rows found 100"),
        "{message}"
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

/// How kvgeom judged one trace: the error's message, or check-trace's and
/// diff-trace's (`--policy vllm-0.33.0`) verdicts.
#[derive(Debug, PartialEq)]
enum Judged {
    Error(String),
    Verdicts { check: String, diff: String },
}

fn judge(path: &Path) -> Judged {
    let case = match TraceCase::read(path) {
        Ok(case) => case,
        Err(e) => return Judged::Error(e.to_string()),
    };
    let check = if case.remotes.iter().any(|r| r.refused.is_some()) {
        "rejected".to_string()
    } else {
        match kvgeom::trace::check_case(&case) {
            Ok(r) => format!("{} violations", r.violations.len()),
            Err(e) => return Judged::Error(e.to_string()),
        }
    };
    let diff = match kvgeom::trace::diff_against_connector(
        &case,
        kvgeom::connector::Policy::vllm_0_33_0(),
    ) {
        Ok(r) => r.to_string(),
        Err(e) => e.to_string(),
    };
    Judged::Verdicts { check, diff }
}

/// Sets `pointer` of every `ev` event to `value`, adding the last key to
/// its object when absent.
fn put(lines: &mut [Value], ev: &str, pointer: &str, value: &Value) {
    let (parent, key) = pointer.rsplit_once('/').unwrap();
    for line in lines.iter_mut().filter(|l| l["ev"] == ev) {
        match line
            .pointer_mut(parent)
            .unwrap_or_else(|| panic!("{ev}{parent}"))
        {
            Value::Object(o) => {
                o.insert(key.to_string(), value.clone());
            }
            Value::Array(a) => a[key.parse::<usize>().unwrap()] = value.clone(),
            other => panic!("{ev}{pointer}: parent is {other}"),
        }
    }
}

/// Modelled or refused fields and a value that must change how the trace
/// is judged: `(ev, pointer, value)`.
fn verdict_changing_edits() -> Vec<(&'static str, &'static str, Value)> {
    use serde_json::json;
    vec![
        ("meta", "/params/cached", json!(2)),
        ("meta", "/params/alloc", json!("all-blocks")),
        ("meta", "/params/d_tp", json!(4)),
        ("meta", "/params/d_rank", json!(1)),
        ("meta", "/params/p_tp", json!(8)),
        ("meta", "/params/num_tokens", json!(7)),
        ("meta", "/params/prefix_hit", json!(48)),
        ("meta", "/params/speculative", json!(true)),
        // Both traces have an attention group and two mamba groups.
        ("meta", "/params/groups", json!(["attention", "mamba"])),
        (
            "meta",
            "/params/groups",
            json!(["mamba", "attention", "mamba"]),
        ),
        (
            "meta",
            "/params/groups",
            json!(["attention", "attention", "attention"]),
        ),
        (
            "meta",
            "/params/groups",
            json!(["attention", "sliding_window", "mamba"]),
        ),
        ("case", "/args/local_block", json!(40)),
        ("case", "/args/kernel", json!(8)),
        ("case", "/args/remote_block", json!(40)),
        ("case", "/args/num_tokens", json!(7)),
        ("case", "/args/tp_size", json!(8)),
        ("case", "/args/remote_kernel", json!(8)),
        ("case", "/args/remote_dcp_size", json!(2)),
        ("case", "/args/cached", json!(3)),
        ("case", "/args/local_dcp_size", json!(2)),
        ("case", "/args/local_rank", json!(1)),
        ("make_worker", "/args/local_block_size", json!(40)),
        ("make_worker", "/args/kernel_block_size", json!(8)),
        ("make_worker", "/args/num_logical_blocks", json!(7)),
        ("make_worker", "/args/tp_size", json!(4)),
        ("make_worker", "/args/tp_rank", json!(1)),
        ("make_worker", "/args/dcp_size", json!(2)),
        ("register_memory", "/regions/0/0", json!(4096)),
        ("dlist", "/mem_type", json!("DRAM")),
        ("dlist", "/strided/0/1", json!(47)),
        (
            "local_geometry",
            "/worker_cls",
            json!("NixlPushConnectorWorker"),
        ),
        ("local_geometry", "/geometry/use_mla", json!(false)),
        ("local_geometry", "/geometry/_has_mamba", json!(false)),
        ("local_geometry", "/geometry/kv_cache_layout", json!("HND")),
        ("local_geometry", "/geometry/block_size", json!(8)),
        ("local_geometry", "/geometry/num_blocks", json!(99)),
        ("local_geometry", "/geometry/_logical_num_blocks", json!(9)),
        (
            "local_geometry",
            "/geometry/_physical_blocks_per_logical_kv_block",
            json!(7),
        ),
        ("local_geometry", "/geometry/num_regions", json!(3)),
        (
            "local_geometry",
            "/geometry/block_len_per_layer",
            json!([48, 96]),
        ),
        (
            "local_geometry",
            "/geometry/block_stride_per_layer",
            json!([96, 96]),
        ),
        (
            "local_geometry",
            "/geometry/region_num_blocks",
            json!([1, 1]),
        ),
        (
            "local_geometry",
            "/geometry/region_group_ids",
            json!([0, 1]),
        ),
        (
            "local_geometry",
            "/geometry/region_group_ids",
            json!([0, 0]),
        ),
        (
            "local_geometry",
            "/geometry/_region_is_mla",
            json!([true, false]),
        ),
        (
            "local_geometry",
            "/geometry/_ssm_region_indices",
            json!([1]),
        ),
        (
            "local_geometry",
            "/geometry/_mamba_ssm_size",
            json!([96, 64]),
        ),
        ("local_geometry", "/geometry/use_host_buffer", json!(true)),
        ("local_geometry", "/geometry/dcp_size", json!(2)),
        ("local_geometry", "/geometry/pcp_size", json!(2)),
        ("local_geometry", "/geometry/pp_size", json!(2)),
        ("local_geometry", "/geometry/_is_csa_linear", json!(true)),
        (
            "local_geometry",
            "/geometry/_transfer_layer_region_indices",
            json!([0]),
        ),
        (
            "local_geometry",
            "/geometry/_transfer_layer_group_ids",
            json!([0]),
        ),
        (
            "local_geometry",
            "/geometry/_scratch_region_indices",
            json!([0]),
        ),
        ("local_geometry", "/geometry/_ple_group_index", json!(0)),
        ("local_geometry", "/geometry/_sliding_window", json!(128)),
        ("local_geometry", "/geometry/tp_rank", json!(1)),
        ("local_geometry", "/geometry/world_size", json!(4)),
        ("make_remote_meta", "/args/remote_block_size", json!(40)),
        (
            "make_remote_meta",
            "/args/remote_kernel_block_size",
            json!(8),
        ),
        ("make_remote_meta", "/args/remote_num_logical", json!(99)),
        ("add_remote_agent", "/args/remote_tp_rank", json!(9)),
        ("add_remote_agent", "/args/remote_tp_size", json!(4)),
        ("add_remote_agent", "/args/remote_dcp_size", json!(2)),
        ("add_remote_agent", "/exception", json!("handshake refused")),
        (
            "add_remote_agent",
            "/remote_meta/kv_caches_base_addr",
            json!([4096, 8192]),
        ),
        ("add_remote_agent", "/remote_meta/num_blocks", json!(4)),
        (
            "add_remote_agent",
            "/remote_meta/block_lens",
            json!([96, 96]),
        ),
        (
            "add_remote_agent",
            "/remote_meta/block_strides",
            json!([96, 96]),
        ),
        (
            "add_remote_agent",
            "/remote_meta/kv_cache_layout",
            json!("HND"),
        ),
        ("add_remote_agent", "/remote_meta/block_size", json!(8)),
        (
            "add_remote_agent",
            "/remote_meta/ssm_sizes",
            json!([12, 32]),
        ),
        (
            "add_remote_agent",
            "/remote_meta/physical_blocks_per_logical_kv_block",
            json!(5),
        ),
        (
            "add_remote_agent",
            "/remote_meta/region_num_blocks",
            json!([4, 4]),
        ),
        ("add_remote_agent", "/remote_meta/dcp_size", json!(2)),
        ("add_remote_agent", "/remote_meta/pcp_size", json!(2)),
        ("add_remote_agent", "/remote_meta/ple_block_len", json!(8)),
        (
            "add_remote_agent",
            "/remote_meta/packed_member_layouts",
            json!({"a": 1}),
        ),
        (
            "add_remote_agent",
            "/remote_meta/region_group_ids",
            json!([0, 1]),
        ),
        (
            "add_remote_agent",
            "/remote_meta/kv_transfer_mode",
            json!("packed"),
        ),
        ("request", "/prompt_len", json!(200)),
        ("request", "/matched_tokens", json!(3)),
        ("request", "/local_block_ids/0/0", json!(7)),
        ("request", "/local_physical_block_ids/0/0", json!(0)),
        ("request", "/local_num_computed_blocks", json!([1, 1, 0])),
        ("request", "/remote_block_ids/0/0", json!(3)),
        ("request", "/tp_size", json!(4)),
        ("request", "/dcp_size", json!(2)),
        ("xfer", "/op", json!("WRITE")),
        ("xfer", "/local_ids/0", json!(0)),
        ("xfer", "/remote_ids/0", json!(0)),
        ("request_done", "/after_call/remote_block_ids/0/0", json!(0)),
    ]
}

/// Informational fields: any value leaves the verdicts as they are.
fn informational_edits() -> Vec<(&'static str, &'static str, Value)> {
    use serde_json::json;
    vec![
        ("meta", "/nodeid", json!("elsewhere::t")),
        ("meta", "/test", json!("t")),
        ("meta", "/vllm", json!("0.0.1")),
        ("meta", "/params/seed", json!(7)),
        ("meta", "/params/geometry", json!("g")),
        (
            "meta",
            "/params/groups",
            json!(["attention", "mamba", "mamba"]),
        ),
        ("case", "/fn", json!("other")),
        ("make_worker", "/fn", json!("other")),
        ("nixl_agent", "/cls", json!("Other")),
        ("register_memory", "/regions/0/3", json!("kv.0")),
        ("register_memory", "/backends", json!(["LIBFABRIC"])),
        (
            "local_geometry",
            "/geometry/region_names",
            json!(["a", "b"]),
        ),
        ("local_geometry", "/geometry/num_descs", json!(1)),
        (
            "add_remote_agent",
            "/remote_meta/attn_backend_name",
            json!("OTHER"),
        ),
        (
            "add_remote_agent",
            "/remote_meta/region_names",
            json!(["a", "b"]),
        ),
        ("add_remote_agent", "/dst_num_blocks", json!(1)),
        ("make_remote_meta", "/args/remote_ssm_sizes", json!([1, 2])),
        ("request_done", "/geometry/num_descs", json!(1)),
        ("result", "/outcome", json!("failed")),
        ("result", "/duration_s", json!(99.0)),
        ("result", "/message", json!("assertion")),
    ]
}

#[test]
fn every_modelled_or_refused_field_changes_the_verdict_and_informational_ones_do_not() {
    let dir = scratch(module_path!(), "field-mutations");
    let started = std::time::Instant::now();
    let repro = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/vllm-0.33.0-v1-reproducers")
        .join("A1-mla-kda-16-4-prefix-tp1-tp1_N18-c1-mainline.jsonl");
    for source in [v1_trace(GOOD), repro] {
        let lines = trace_lines(&source);
        let base = judge(&source);
        assert!(matches!(base, Judged::Verdicts { .. }), "{base:?}");
        let edited = |ev: &str, pointer: &str, value: &Value| {
            let mut lines = lines.clone();
            put(&mut lines, ev, pointer, value);
            let path = dir.join(format!("{}{}.jsonl", ev, pointer.replace('/', "-")));
            let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
            std::fs::write(&path, text).unwrap();
            path
        };
        for (ev, pointer, value) in verdict_changing_edits() {
            let got = judge(&edited(ev, pointer, &value));
            let what = format!("{}: {ev}{pointer} = {value}: {got:?}", source.display());
            assert_ne!(got, base, "{what}");
            if let Judged::Error(message) = &got {
                assert!(!message.contains("panicked"), "{what}");
                if message.contains("refused:") {
                    let field = pointer
                        .rsplit('/')
                        .find(|s| s.parse::<usize>().is_err())
                        .unwrap();
                    assert!(
                        message.contains(field),
                        "the refusal names another field: {what}"
                    );
                }
            }
        }
        for (ev, pointer, value) in informational_edits() {
            let got = judge(&edited(ev, pointer, &value));
            assert_eq!(got, base, "{}: {ev}{pointer} = {value}", source.display());
        }
    }
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn counts_the_blocks_cannot_hold_are_errors_naming_the_file_and_the_field() {
    let dir = scratch(module_path!(), "counts");
    let cases = [
        // vLLM's sweep case 25-12-8 holds 25 tokens in 3 blocks of 12.
        (
            "huge-prompt.jsonl",
            vec![
                ("/prompt_len", Value::from(4294967295u64)),
                ("/matched_tokens", Value::from(4294967294u64)),
            ],
            "`request` field `prompt_len` is 4294967295, but a prompt has 1 to 1048576 tokens",
        ),
        (
            "long-prompt.jsonl",
            vec![
                ("/prompt_len", Value::from(100)),
                ("/matched_tokens", Value::from(99)),
            ],
            "`request` field `local_block_ids[0]` is 3 blocks, but decode's 3 blocks of 12 tokens \
             hold 36 tokens, fewer than the 99 transferred of prompt_len 100",
        ),
        (
            "short-prompt.jsonl",
            vec![
                ("/prompt_len", Value::from(5)),
                ("/matched_tokens", Value::from(4)),
            ],
            "`request` field `local_block_ids[0]` is 3 blocks, but decode's 3 blocks of 12 tokens \
             reach past the 5-token prompt by a whole block",
        ),
        (
            "matched.jsonl",
            vec![("/matched_tokens", Value::from(25))],
            "`request` field `matched_tokens` is 25, but prompt_len 25 transfers 24 tokens",
        ),
        (
            "huge-hit.jsonl",
            vec![(
                "/local_num_computed_blocks",
                serde_json::json!([4294967295u64, 0, 0]),
            )],
            "`request` field `local_num_computed_blocks[0]` is 4294967295, but decode's pool holds \
             10 logical blocks of 12 tokens, 3 of them the request's",
        ),
        (
            "hit.jsonl",
            vec![("/local_num_computed_blocks", serde_json::json!([3, 0, 0]))],
            "`request` field `local_num_computed_blocks[0]` is 3, but 3 blocks of 12 tokens are \
             more than the 24 tokens transferred",
        ),
    ];
    for (name, edits, want) in cases {
        let path = dir.join(name);
        write_edited(&path, |line| {
            if line["ev"] == "request" {
                for (pointer, value) in &edits {
                    *line.pointer_mut(pointer).unwrap() = value.clone();
                }
            }
        });
        for command in [
            &["check-trace"][..],
            &["diff-trace", "--policy", "vllm-0.33.0"],
        ] {
            let mut args = command.to_vec();
            args.push(path.to_str().unwrap());
            let o = kvgeom(&args);
            assert_eq!(o.status.code(), Some(2), "{name} {command:?}");
            let text = String::from_utf8_lossy(&o.stdout).to_string()
                + &String::from_utf8_lossy(&o.stderr);
            let line = text.lines().find(|l| l.contains(name)).unwrap_or_default();
            assert!(
                line.contains(&format!("{}:", path.display())) && line.contains(want),
                "{name} {command:?}: {text}"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
