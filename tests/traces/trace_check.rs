//! The descriptor-level oracles on vLLM's own recorded transfers.

use std::path::PathBuf;

use std::process::Command;

use kvgeom::trace::check_case;
use kvgeom::trace::{SkippedCheck, TraceCase};
use serde_json::Value;

use crate::support::{v1_trace, v1_trace_dir};

/// A (24, 4) trace: its prefill pages cannot hold the state it advertises.
const SWEEP_25_24_4: &str = "test_hetero_ppl_token_alignment_sweep_25-24-4.jsonl.gz";

#[test]
fn every_fixture_passes_the_descriptor_level_oracles() {
    let dir = v1_trace_dir();
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
    let mut case = TraceCase::read(&v1_trace(SWEEP_25_24_4)).unwrap();
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
    let small = v1_trace(SWEEP_25_24_4);
    let full = v1_trace("test_hetero_ppl_token_alignment_sweep_25-12-8.jsonl.gz");
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
    let mut case = TraceCase::read(&v1_trace(
        "test_hetero_ppl_token_alignment_sweep_25-12-8.jsonl.gz",
    ))
    .unwrap();
    // Read P's kernel blocks of the first attention pair in the wrong order.
    case.xfers[0].remote_ids.swap(0, 1);
    let report = check_case(&case).unwrap();
    let oracles: Vec<&str> = report.violations.iter().map(|v| v.oracle).collect();
    assert!(oracles.contains(&"pairing"), "{:?}", report.violations);
    // Dropping the second rank's read loses its state shards.
    let mut case = TraceCase::read(&v1_trace(
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

fn reproducer(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/vllm-0.33.0-v1-reproducers")
        .join(name)
}

const N18_MAINLINE: &str = "A1-mla-kda-16-4-prefix-tp1-tp1_N18-c1-mainline.jsonl";
const N33_WITH_LAST_TOKEN: &str = "A1-mla-kda-16-4-prefix-tp1-tp1_N33-c1-with-last-token.jsonl";
const C_DECODE_RANK_0_OF_2: &str = "C-mla-kda-p1-12-4-d2-8-4_N10-r0.jsonl";

/// One trace's events, one JSON object per line.
fn events(path: &std::path::Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn first<'a>(lines: &'a [Value], ev: &str) -> &'a Value {
    lines.iter().find(|l| l["ev"] == ev).unwrap()
}

/// The attention pairs of a reproducer whose two ends hold different
/// tokens, worked out from the desc ids alone: the first `regions x
/// kernel blocks` rows of either list are the attention rows, region by
/// region; a row's kernel block lies in a logical block whose place in the
/// side's block list (decode: the prefix-hit blocks `2i+1`, then the
/// request's) gives its first token.
fn misaligned_attention_pairs(lines: &[Value]) -> usize {
    let request = first(lines, "request");
    let worker = &first(lines, "make_worker")["args"];
    let remote = &first(lines, "add_remote_agent")["remote_meta"];
    let u = |v: &Value| v.as_u64().unwrap();
    let (kernel, local_blocks) = (
        u(&worker["kernel_block_size"]),
        u(&worker["num_logical_blocks"]),
    );
    let local_ppl = u(&worker["local_block_size"]) / kernel;
    let (remote_kernel, remote_ppl) = (
        u(&remote["block_size"]),
        u(&remote["physical_blocks_per_logical_kv_block"]),
    );
    let remote_blocks = u(&remote["num_blocks"]);
    let cached = u(&request["local_num_computed_blocks"][0]);
    let mut decode: Vec<u64> = (0..cached).map(|i| 2 * i + 1).collect();
    decode.extend(
        request["local_block_ids"][0]
            .as_array()
            .unwrap()
            .iter()
            .map(u),
    );
    let prefill: Vec<u64> = request["remote_block_ids"][0]
        .as_array()
        .unwrap()
        .iter()
        .map(u)
        .collect();
    let token = |id: u64, kernel_blocks: u64, ppl: u64, kernel: u64, blocks: &[u64]| {
        let block = id % kernel_blocks;
        let place = blocks.iter().position(|&b| b == block / ppl)?;
        Some(place as u64 * ppl * kernel + block % ppl * kernel)
    };
    let mut misaligned = 0;
    for x in lines.iter().filter(|l| l["ev"] == "xfer") {
        let pairs = x["local_ids"]
            .as_array()
            .unwrap()
            .iter()
            .zip(x["remote_ids"].as_array().unwrap());
        for (l, r) in pairs {
            let (l, r) = (u(l), u(r));
            if l >= 2 * local_blocks * local_ppl {
                continue; // a mamba row
            }
            let d = token(l, local_blocks * local_ppl, local_ppl, kernel, &decode);
            let p = token(r, remote_blocks, remote_ppl, remote_kernel, &prefill);
            misaligned += usize::from(d.is_none() || d != p);
        }
    }
    misaligned
}

/// `kvgeom ARGS --format json`'s verdict and `explained_by` for one file.
fn verdict(args: &[&str], path: &std::path::Path) -> (Option<i32>, String, Value) {
    let mut all = args.to_vec();
    all.extend([path.to_str().unwrap(), "--format", "json"]);
    let o = Command::new(env!("CARGO_BIN_EXE_kvgeom"))
        .args(&all)
        .output()
        .expect("kvgeom runs");
    let report: Value = serde_json::from_slice(&o.stdout).unwrap();
    let file = &report["files"][0];
    (
        o.status.code(),
        file["verdict"].as_str().unwrap().to_string(),
        file["explained_by"].clone(),
    )
}

#[test]
fn the_reproducers_get_the_verdicts_their_desc_ids_give() {
    // The truth of the README, from the desc ids.
    let truth = [
        (N18_MAINLINE, 0),
        (N33_WITH_LAST_TOKEN, 16),
        (C_DECODE_RANK_0_OF_2, 0),
    ];
    for (name, misaligned) in truth {
        assert_eq!(
            misaligned_attention_pairs(&events(&reproducer(name))),
            misaligned,
            "{name}"
        );
    }
    let vllm = ["diff-trace", "--policy", "vllm-0.33.0"];
    for (name, check, default_diff) in [
        (N18_MAINLINE, "passed", ("match", Value::Null)),
        (
            N33_WITH_LAST_TOKEN,
            "violations",
            ("differ", Value::from("end-trim-alignment")),
        ),
        (C_DECODE_RANK_0_OF_2, "passed", ("match", Value::Null)),
    ] {
        let path = reproducer(name);
        let exit = |v: &str| Some(i32::from(v == "violations" || v == "differ"));
        assert_eq!(
            verdict(&["check-trace"], &path),
            (exit(check), check.to_string(), Value::Null),
            "{name}"
        );
        assert_eq!(
            verdict(&vllm, &path),
            (Some(0), "match".to_string(), Value::Null),
            "{name}"
        );
        let (v, explained) = default_diff;
        assert_eq!(
            verdict(&["diff-trace"], &path),
            (exit(v), v.to_string(), explained),
            "{name}"
        );
    }
    // The violations are the 16 misaligned attention pairs and nothing else.
    let report = check_case(&TraceCase::read(&reproducer(N33_WITH_LAST_TOKEN)).unwrap()).unwrap();
    assert_eq!(report.violations.len(), 16, "{:?}", report.violations);
    assert!(report
        .violations
        .iter()
        .all(|v| v.oracle == "pairing" && v.message.contains("token misalignment")));
}

/// A reproducer with `edit` applied to each event, written to `dir`.
fn edited(dir: &std::path::Path, name: &str, out: &str, edit: impl Fn(&mut Value)) -> PathBuf {
    let mut text = String::new();
    for mut line in events(&reproducer(name)) {
        edit(&mut line);
        text.push_str(&line.to_string());
        text.push('\n');
    }
    let path = dir.join(out);
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn hand_built_prefix_hit_variants_are_judged_by_their_tokens() {
    let dir = std::env::temp_dir().join(format!(
        "kvgeom-trace-check-{}-variants",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // N33 repaired: decode's block 3 (tokens 16..32) reads P's block 4
    // (tokens 16..32); block 5 (tokens 32..48) holds nothing transferred.
    let repaired = edited(&dir, N33_WITH_LAST_TOKEN, "n33-repaired.jsonl", |l| {
        if l["ev"] == "xfer" {
            let keep = |ids: &Value, attention: [u64; 8]| -> Value {
                let mut out: Vec<Value> = attention.iter().map(|&i| i.into()).collect();
                out.extend(ids.as_array().unwrap()[16..].iter().cloned());
                out.into()
            };
            l["local_ids"] = keep(&l["local_ids"], [12, 13, 14, 15, 52, 53, 54, 55]);
            l["remote_ids"] = keep(&l["remote_ids"], [16, 17, 18, 19, 48, 49, 50, 51]);
        }
    });
    // N18 written into the prefix-hit block 1 (tokens 0..16) instead of
    // block 3: what the first-transferred-block-is-token-0 reading passed.
    let into_hit = edited(&dir, N18_MAINLINE, "n18-into-hit.jsonl", |l| {
        if l["ev"] == "xfer" {
            for k in 0..4 {
                l["local_ids"][k] = (4 + k as u64).into();
                l["local_ids"][4 + k] = (36 + k as u64).into();
            }
        }
    });
    for (path, misaligned, check) in [(&repaired, 0, "passed"), (&into_hit, 8, "violations")] {
        assert_eq!(
            misaligned_attention_pairs(&events(path)),
            misaligned,
            "{}",
            path.display()
        );
        assert_eq!(
            verdict(&["check-trace"], path).1,
            check,
            "{}",
            path.display()
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn one_decode_rank_of_two_is_judged_as_that_rank() {
    let dir = std::env::temp_dir().join(format!("kvgeom-trace-check-{}-rank1", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // Decode rank 1 of 2 under prefill TP1: the attention rows are rank 0's
    // (MLA is replicated); each mamba row of P's list starts one shard later
    // (rank 1 holds the second half of every conv sub-projection and of the
    // SSM state), with the same desc ids.
    let as_rank_1 = |shift: bool| {
        move |l: &mut Value| match l["ev"].as_str() {
            Some("meta") => l["params"]["d_rank"] = 1.into(),
            Some("case") => l["args"]["local_rank"] = 1.into(),
            Some("make_worker") => l["args"]["tp_rank"] = 1.into(),
            Some("local_geometry") | Some("request_done") => l["geometry"]["tp_rank"] = 1.into(),
            Some("dlist") if shift && l["target"] != "NIXL_INIT_AGENT" => {
                for run in l["strided"].as_array_mut().unwrap().iter_mut().skip(2) {
                    let len = run[1].as_u64().unwrap();
                    run[0] = (run[0].as_u64().unwrap() + len).into();
                }
                l.as_object_mut().unwrap().remove("rows");
            }
            _ => {}
        }
    };
    let rank1 = edited(&dir, C_DECODE_RANK_0_OF_2, "c-rank1.jsonl", as_rank_1(true));
    // The same file reading rank 0's shards into rank 1: every mamba pair wrong.
    let wrong = edited(
        &dir,
        C_DECODE_RANK_0_OF_2,
        "c-rank1-rank0-shards.jsonl",
        as_rank_1(false),
    );
    let vllm = ["diff-trace", "--policy", "vllm-0.33.0"];
    assert_eq!(verdict(&["check-trace"], &rank1).1, "passed");
    assert_eq!(verdict(&vllm, &rank1).1, "match");
    let report = check_case(&TraceCase::read(&wrong).unwrap()).unwrap();
    // 8 mamba pairs per region, two regions.
    assert_eq!(report.violations.len(), 16, "{:?}", report.violations);
    assert!(report
        .violations
        .iter()
        .all(|v| v.rank == Some(1) && v.message.contains("state slices differ")));
    assert_eq!(verdict(&vllm, &wrong).1, "differ");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_trace_registering_another_mamba_split_than_the_model_is_refused() {
    let dir = std::env::temp_dir().join(format!("kvgeom-trace-check-{}-split", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // The sweep's own list splits conv 12|12|24 bytes (KDA's Q|K|V = 1:1:2);
    // 16|8|24 is a model kvgeom does not rebuild from a v1 trace.
    let bytes = std::fs::read(v1_trace(
        "test_hetero_ppl_token_alignment_sweep_25-12-8.jsonl.gz",
    ))
    .unwrap();
    let text = kvgeom::trace::decompress(std::path::Path::new("t"), &bytes).unwrap();
    let mut out = String::new();
    let mut first_list = true;
    for line in String::from_utf8(text).unwrap().lines() {
        let mut l: Value = serde_json::from_str(line).unwrap();
        if l["ev"] == "dlist" && std::mem::take(&mut first_list) {
            for (q, k) in [(2, 3), (6, 7)] {
                let runs = l["strided"].as_array_mut().unwrap();
                assert_eq!(
                    (runs[q][1].as_u64(), runs[k][1].as_u64()),
                    (Some(12), Some(12))
                );
                runs[q][1] = 16.into();
                runs[k][0] = (runs[k][0].as_u64().unwrap() + 4).into();
                runs[k][1] = 8.into();
            }
        }
        out.push_str(&l.to_string());
        out.push('\n');
    }
    let path = dir.join("split.jsonl");
    std::fs::write(&path, out).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_kvgeom"))
        .args(["check-trace", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let text = String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
    assert!(
        text.contains("refused: the model kvgeom rebuilds from the trace's sizes")
            && text.contains("dlist #0")
            && text.contains("record a v2 trace"),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_trace_that_handshook_with_one_prefill_rank_of_two_is_judged() {
    let mut case = TraceCase::read(&v1_trace(
        "test_hetero_ppl_token_alignment_sweep_25-12-8.jsonl.gz",
    ))
    .unwrap();
    // Without prefill rank 1's handshake, list and read, decode misses the
    // second half of every state: coverage says so, nothing is an error.
    let rank1 = case.remotes.iter().position(|r| r.tp_rank == 1).unwrap();
    let list = case.remotes[rank1].dlist.unwrap();
    case.xfers.retain(|x| x.remote_list != list);
    case.remotes.remove(rank1);
    case.dlists.remove(list);
    for x in &mut case.xfers {
        x.remote_list -= usize::from(x.remote_list > list);
        x.local_list -= usize::from(x.local_list > list);
    }
    let report = check_case(&case).unwrap();
    assert!(!report.violations.is_empty());
    assert!(
        report.violations.iter().all(|v| v.oracle == "coverage"),
        "{:?}",
        report.violations
    );
}
