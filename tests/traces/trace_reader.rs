//! The vLLM trace fixtures: they read, they agree with their source traces,
//! a faithful re-issue of each case diffs as MATCH, and perturbations and
//! malformed input are reported precisely.

use std::path::{Path, PathBuf};

use kvgeom::nixl::{DescList, DescRow, DlistTarget, DryRun, Event, MemKind, Recording, XferOp};
use kvgeom::trace::{
    diff_block_ids, diff_run, parse_trace, read_trace, reissue, write_fixture, ActualRun,
    DiffReport, Difference, ListRole, Location, Relocation, Side, TraceCase, TraceErrorKind,
    TraceEvent,
};

use crate::support::{skip, v1_trace, v1_traces};

const CASE_10_12_8: &str = "test_hetero_ppl_token_alignment_sweep_10-12-8";
const MULTI_READ: &str = "test_hetero_ppl_multi_read_writes_stay_within_request_blocks";

/// The v1 fixture of the traced case `name`.
fn case_trace(name: &str) -> PathBuf {
    v1_trace(&format!("{name}.jsonl.gz"))
}

/// Where the original traces are, if this machine has them
/// (`KVGEOM_VLLM_TRACES`, else `../shared/vllm-traces` beside the checkout).
fn source_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("KVGEOM_VLLM_TRACES")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/vllm-traces"));
    dir.is_dir().then_some(dir)
}

/// Re-issue a case with every base moved, so that only normalisation can
/// make it match.
fn reissued(case: &TraceCase) -> (Recording<DryRun>, ActualRun) {
    let mut rec = Recording::new(DryRun::new());
    let relocation = Relocation::shifted(case, 0x7000_0000, 0x4000_0000);
    let actual = reissue(case, &mut rec, "decode-0", &relocation).unwrap();
    (rec, actual)
}

#[test]
fn every_fixture_reads_as_a_passed_case_with_rows_inside_regions() {
    let files = v1_traces();
    assert_eq!(files.len(), 153);
    let (mut lists, mut rows, mut xfers, mut pairs) = (0, 0, 0, 0);
    let mut overrunning = Vec::new();
    for path in &files {
        let case = TraceCase::read(path).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(case.result.outcome, "passed", "{}", case.name);
        assert_eq!(case.meta.vllm, "0.33.0");
        assert_eq!(case.remotes.len(), 2, "{}", case.name);
        for index in 0..case.dlists.len() {
            // Sizes to hold rows against: registered lengths (local), block
            // count times block stride from the metadata (remote).
            let sizes = match case.dlists[index].role {
                ListRole::Remote { remote, .. } => case.remotes[remote].meta.region_lens(),
                _ => case.local_region_lens(),
            };
            for (row_index, row) in case.normalized_rows(index).iter().enumerate() {
                let Location::InRegion { region, offset } = row.at else {
                    panic!(
                        "{} dlist #{index} row {row_index} outside: {row}",
                        case.name
                    );
                };
                assert!(
                    offset < sizes[region],
                    "{} dlist #{index} row {row_index}",
                    case.name
                );
                if offset + row.len > sizes[region] {
                    overrunning.push(case.name.clone());
                }
            }
            rows += case.dlists[index].list.len();
        }
        lists += case.dlists.len();
        xfers += case.xfers.len();
        pairs += case.xfers.iter().map(|x| x.local_ids.len()).sum::<usize>();
    }
    assert_eq!((lists, rows, xfers, pairs), (765, 114_104, 306, 6674));
    // Only the remote SSM rows of the (24, 4) sweep run past the remote's
    // blocks: vLLM's synthetic P keeps a 56-byte mamba state (conv 24 + ssm
    // 32) in 48-byte blocks, so the last block's SSM row ends 8 bytes past
    // the region; one row per region per remote list, 4 per case, 38 cases.
    assert_eq!(overrunning.len(), 152);
    assert!(
        overrunning.iter().all(|n| n.ends_with("-24-4")),
        "{overrunning:?}"
    );
}

#[test]
fn sweep_case_10_12_8_carries_the_recorded_inputs_and_answers() {
    let case = TraceCase::read(&case_trace(CASE_10_12_8)).unwrap();
    assert_eq!(case.name, CASE_10_12_8);
    assert_eq!(case.meta.params["num_tokens"], 10);
    let args = case.case_args.as_ref().unwrap();
    assert_eq!(
        (
            args.local_block,
            args.kernel,
            args.remote_block,
            args.tp_size
        ),
        (12, 4, 8, 2)
    );
    let w = &case.worker;
    assert_eq!(
        (
            w.local_block_size,
            w.kernel_block_size,
            w.num_logical_blocks,
            w.tp_size,
            w.tp_rank
        ),
        (12, 4, 8, 1, 0)
    );
    let regions: Vec<(u64, u64)> = case.local_regions.iter().map(|r| (r.addr, r.len)).collect();
    assert_eq!(regions, [(93855548891712, 1152), (93855548882624, 1152)]);
    let g = &case.local_geometry;
    assert_eq!(
        (g.block_size, g.num_blocks, g.physical_blocks_per_logical),
        (4, 24, 3)
    );
    assert_eq!(g.block_len_per_layer, [48, 48]);
    assert_eq!(g.block_stride_per_layer, [48, 48]);
    assert_eq!(g.mamba_ssm_size, Some(vec![48, 64]));
    assert_eq!(g.region_is_mla, [true, true]);
    assert_eq!(g.ssm_region_indices, [0, 1]);
    assert_eq!(g.src_blocks_data, None);

    let ranks: Vec<(u32, u32, &str)> = case
        .remotes
        .iter()
        .map(|r| (r.tp_rank, r.tp_size, r.agent_name.as_str()))
        .collect();
    assert_eq!(ranks, [(0, 2, "remote-agent"), (1, 2, "remote-agent")]);
    let m = &case.remotes[1].meta;
    assert_eq!(m.kv_caches_base_addr, [0x1000_0000, 0x2000_0000]);
    assert_eq!(
        (
            m.num_blocks,
            m.block_size,
            m.physical_blocks_per_logical_kv_block
        ),
        (16, 4, 2)
    );
    assert_eq!(m.ssm_sizes, Some(vec![24, 32]));
    assert_eq!(m.region_lens(), [768, 768]);
    assert_eq!(case.remotes[1].dlist, Some(4));

    let r = &case.request;
    assert_eq!((r.prompt_len, r.matched_tokens), (Some(10), Some(9)));
    assert_eq!(r.blocks.local_block_ids, [vec![1], vec![0], vec![4]]);
    assert_eq!(
        r.blocks.local_physical_block_ids,
        [vec![3, 4, 5], vec![0], vec![4]]
    );
    assert_eq!(r.blocks.remote_block_ids, [vec![2, 4], vec![1], vec![0]]);

    let shape: Vec<(u64, ListRole, MemKind, u64)> = case
        .dlists
        .iter()
        .map(|d| (d.handle.0, d.role, d.mem, d.list.len()))
        .collect();
    assert_eq!(
        shape,
        [
            (1, ListRole::Local, MemKind::Dram, 112),
            (2, ListRole::Split, MemKind::Vram, 112),
            (3, ListRole::Split, MemKind::Vram, 112),
            (
                4,
                ListRole::Remote {
                    remote: 0,
                    tp_rank: 0
                },
                MemKind::Vram,
                96
            ),
            (
                5,
                ListRole::Remote {
                    remote: 1,
                    tp_rank: 1
                },
                MemKind::Vram,
                96
            ),
        ]
    );
    assert_eq!(case.list_label(3), "remote rank 0, target remote-agent");
    assert_eq!(
        case.normalized_rows(2)[61].to_string(),
        "(region 0, +738, len 6)"
    );
    assert_eq!(
        case.normalized_rows(4).last().unwrap().to_string(),
        "(region 1, +696, len 32)"
    );

    let x = &case.xfers[0];
    assert_eq!((x.op, x.local_list, x.remote_list), (XferOp::Read, 1, 3));
    assert_eq!(&x.local_ids[..6], [3, 4, 5, 27, 28, 29]);
    assert_eq!(&x.remote_ids[..6], [4, 5, 8, 20, 21, 24]);
    assert_eq!(x.notif_msg.as_deref(), Some("prefill-req-b:1"));
    assert_eq!(
        (case.xfers[1].local_list, case.xfers[1].remote_list),
        (2, 4)
    );
    let done = case
        .request_done
        .as_ref()
        .unwrap()
        .after_call
        .as_ref()
        .unwrap();
    assert_eq!(done.remote_block_ids, [vec![4, 5, 8, 9], vec![1], vec![0]]);
}

#[test]
fn the_fixed_id_case_has_no_sweep_arguments() {
    let case = TraceCase::read(&case_trace(MULTI_READ)).unwrap();
    assert_eq!(case.case_args, None);
    assert_eq!(case.request.prompt_len, None);
    assert_eq!(
        case.request.blocks.local_block_ids,
        [vec![2, 5], vec![1], vec![7]]
    );
    assert_eq!(case.remote_args.as_ref().unwrap().remote_num_logical, 12);
    assert_eq!(case.xfers.len(), 2);
}

#[test]
fn fixtures_hold_the_same_events_as_their_source_traces() {
    let Some(dir) = source_dir() else {
        skip(
            "fixtures_hold_the_same_events_as_their_source_traces",
            "no source traces (set KVGEOM_VLLM_TRACES to their folder)",
        );
        return;
    };
    let mut compared = 0;
    for path in v1_traces() {
        let name = path
            .file_name()
            .unwrap()
            .to_string_lossy()
            .replace(".gz", "");
        let source_path = dir.join(&name);
        if !source_path.exists() {
            println!("no source for {name}");
            continue;
        }
        let fixture = read_trace(&path).unwrap();
        let source = read_trace(&source_path).unwrap();
        assert_eq!(fixture.lines.len(), source.lines.len(), "{name}");
        for (f, s) in fixture.lines.iter().zip(&source.lines) {
            match (&f.event, &s.event) {
                (TraceEvent::Dlist(f), TraceEvent::Dlist(s)) => {
                    assert_eq!((f.handle, &f.target, f.mem), (s.handle, &s.target, s.mem));
                    assert_eq!(
                        f.list.expand(),
                        s.list.expand(),
                        "{name} dlist {:?}",
                        f.handle
                    );
                }
                (TraceEvent::LocalGeometry(f), TraceEvent::LocalGeometry(s)) => {
                    let (mut f, mut s) = (f.clone(), s.clone());
                    assert!(s.geometry.as_ref().unwrap().src_blocks_data.is_some());
                    f.geometry.as_mut().unwrap().src_blocks_data = None;
                    s.geometry.as_mut().unwrap().src_blocks_data = None;
                    assert_eq!(f, s, "{name}");
                }
                (TraceEvent::RequestDone(f), TraceEvent::RequestDone(s)) => {
                    let (mut f, mut s) = (f.clone(), s.clone());
                    f.geometry.as_mut().unwrap().src_blocks_data = None;
                    s.geometry.as_mut().unwrap().src_blocks_data = None;
                    assert_eq!(f, s, "{name}");
                }
                (f, s) => assert_eq!(f, s, "{name}"),
            }
        }
        compared += 1;
    }
    assert_eq!(compared, 153);
}

#[test]
fn rewriting_a_fixture_gives_the_same_bytes() {
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("refixture");
    let src = case_trace(MULTI_READ);
    let dst = out.join(format!("{MULTI_READ}.jsonl.gz"));
    let stats = write_fixture(&src, &dst).unwrap();
    assert_eq!(stats.events, 18);
    assert_eq!(std::fs::read(&dst).unwrap(), std::fs::read(&src).unwrap());
}

#[test]
fn every_case_reissued_at_other_addresses_matches() {
    for path in v1_traces() {
        let case = TraceCase::read(&path).unwrap();
        let (rec, actual) = reissued(&case);
        assert_ne!(actual.local_bases[0], case.local_regions[0].addr);
        assert_eq!(
            diff_run(&case, rec.events(), &actual),
            DiffReport::Match,
            "{}",
            case.name
        );
        let done = case
            .request_done
            .as_ref()
            .unwrap()
            .after_call
            .as_ref()
            .unwrap();
        assert!(diff_block_ids(
            "remote_block_ids",
            &done.remote_block_ids,
            &done.remote_block_ids
        )
        .is_match());
    }
}

fn case_10_12_8() -> (TraceCase, Vec<Event>, ActualRun) {
    let case = TraceCase::read(&case_trace(CASE_10_12_8)).unwrap();
    let (rec, actual) = reissued(&case);
    let events = rec.events().to_vec();
    (case, events, actual)
}

/// The `k`-th recorded dlist.
fn dlist_mut(events: &mut [Event], k: usize) -> &mut DescList {
    events
        .iter_mut()
        .filter_map(|e| match e {
            Event::Dlist { list, .. } => Some(list),
            _ => None,
        })
        .nth(k)
        .unwrap()
}

/// The `k`-th recorded transfer's (local, remote) ids.
fn xfer_ids_mut(events: &mut [Event], k: usize) -> (&mut Vec<u32>, &mut Vec<u32>) {
    events
        .iter_mut()
        .filter_map(|e| match e {
            Event::Xfer {
                local_ids,
                remote_ids,
                ..
            } => Some((local_ids, remote_ids)),
            _ => None,
        })
        .nth(k)
        .unwrap()
}

#[test]
fn a_moved_row_is_reported_with_its_list_and_index() {
    let (case, mut events, actual) = case_10_12_8();
    let list = dlist_mut(&mut events, 2);
    let mut rows: Vec<DescRow> = list.expand();
    rows[61].addr += 6;
    *list = DescList::from_rows(rows);
    let report = diff_run(&case, &events, &actual);
    assert_eq!(
        report.to_string(),
        "dlist #2 (split, target NIXL_INIT_AGENT) row 61: expected (region 0, +738, len 6) found (region 0, +744, len 6)"
    );
}

#[test]
fn a_row_moved_out_of_every_region_is_reported_as_outside() {
    let (case, mut events, actual) = case_10_12_8();
    let list = dlist_mut(&mut events, 4);
    let mut rows = list.expand();
    rows[0].addr = 0x10;
    rows[0].len = 48;
    *list = DescList::from_rows(rows);
    assert_eq!(
        diff_run(&case, &events, &actual).to_string(),
        "dlist #4 (remote rank 1, target remote-agent) row 0: expected (region 0, +0, len 48) found (outside every region: 0x10, len 48)"
    );
}

#[test]
fn a_changed_id_is_reported_with_its_transfer_and_pair() {
    let (case, mut events, actual) = case_10_12_8();
    xfer_ids_mut(&mut events, 0).1[12] = 80;
    let report = diff_run(&case, &events, &actual);
    assert_eq!(
        report,
        DiffReport::Differ(Difference::XferId {
            xfer: 0,
            pair: 12,
            side: Side::Remote,
            expected: 81,
            found: 80
        })
    );
    assert_eq!(
        report.to_string(),
        "xfer #0 pair 12: remote id expected 81 found 80"
    );

    let (case, mut events, actual) = case_10_12_8();
    xfer_ids_mut(&mut events, 1).0.pop();
    assert_eq!(
        diff_run(&case, &events, &actual).to_string(),
        "xfer #1: local ids: expected 16 found 15"
    );
}

#[test]
fn missing_lists_and_transfers_are_count_mismatches() {
    let (case, events, actual) = case_10_12_8();
    let last_xfer = events
        .iter()
        .rposition(|e| matches!(e, Event::Xfer { .. }))
        .unwrap();
    let mut fewer = events.clone();
    fewer.remove(last_xfer);
    assert_eq!(
        diff_run(&case, &fewer, &actual).to_string(),
        "xfer count: expected 2 found 1"
    );

    let mut extra = events.clone();
    let first = extra
        .iter()
        .find(|e| matches!(e, Event::Dlist { .. }))
        .unwrap()
        .clone();
    extra.push(first);
    assert_eq!(
        diff_run(&case, &extra, &actual).to_string(),
        "dlist count: expected 5 found 6"
    );
}

#[test]
fn wrong_handles_mem_types_and_messages_are_named() {
    let (case, mut events, actual) = case_10_12_8();
    let second_split = events
        .iter()
        .filter_map(|e| match e {
            Event::Dlist { handle, .. } => Some(*handle),
            _ => None,
        })
        .nth(2)
        .unwrap();
    for e in &mut events {
        if let Event::Xfer { local, .. } = e {
            *local = second_split;
            break;
        }
    }
    assert_eq!(
        diff_run(&case, &events, &actual).to_string(),
        "xfer #0: local handle expected dlist #1 found dlist #2"
    );

    let (case, mut events, actual) = case_10_12_8();
    for e in &mut events {
        if let Event::Dlist { mem, .. } = e {
            *mem = MemKind::Vram;
            break;
        }
    }
    assert_eq!(
        diff_run(&case, &events, &actual).to_string(),
        "dlist #0 (local, target NIXL_INIT_AGENT): mem type expected Dram found Vram"
    );

    let (case, mut events, actual) = case_10_12_8();
    for e in &mut events {
        if let Event::Xfer { notification, .. } = e {
            *notification = Some(b"prefill-req-b:2".to_vec());
        }
    }
    assert_eq!(
        diff_run(&case, &events, &actual).to_string(),
        "xfer #0: notif_msg expected \"prefill-req-b:1\" found \"prefill-req-b:2\""
    );

    let (case, mut events, actual) = case_10_12_8();
    for e in &mut events {
        if let Event::Dlist { target, .. } = e {
            if matches!(target, DlistTarget::Remote(_)) {
                *target = DlistTarget::Local;
                break;
            }
        }
    }
    assert_eq!(
        diff_run(&case, &events, &actual).to_string(),
        "dlist #3 (remote rank 0, target remote-agent): found target NIXL_INIT_AGENT"
    );
}

#[test]
fn missing_or_mismatched_bases_are_reported() {
    let (case, events, mut actual) = case_10_12_8();
    actual.remote_bases.clear();
    assert_eq!(
        diff_run(&case, &events, &actual).to_string(),
        "dlist #3 (remote rank 0, target remote-agent): no bases given for remote agent `remote-agent`"
    );
    let (case, events, mut actual) = case_10_12_8();
    actual.local_bases.pop();
    assert_eq!(
        diff_run(&case, &events, &actual).to_string(),
        "local regions: expected 2 found 1"
    );
}

fn fixture_text(name: &str) -> Vec<String> {
    let file = read_trace(&case_trace(name)).unwrap();
    let bytes = std::fs::read(&file.path).unwrap();
    let text = kvgeom::trace::decompress(&file.path, &bytes).unwrap();
    String::from_utf8(text)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

fn parse_lines(
    lines: &[String],
) -> Result<Vec<kvgeom::trace::TraceLine>, kvgeom::trace::TraceError> {
    parse_trace(Path::new("bad.jsonl"), (lines.join("\n") + "\n").as_bytes())
}

#[test]
fn a_bad_json_line_is_named_by_number() {
    let mut lines = fixture_text(CASE_10_12_8);
    lines[6].truncate(40);
    let err = parse_lines(&lines).unwrap_err();
    assert_eq!(err.line, Some(7));
    assert!(matches!(err.kind, TraceErrorKind::BadJson(_)), "{err}");
    assert!(
        err.to_string().starts_with("bad.jsonl:7: not valid JSON: "),
        "{err}"
    );
}

#[test]
fn an_unknown_event_is_an_error() {
    let mut lines = fixture_text(CASE_10_12_8);
    lines[3] = r#"{"seq":3,"ev":"warp_drive","agent":0}"#.to_string();
    let err = parse_lines(&lines).unwrap_err();
    assert_eq!(
        err.to_string(),
        "bad.jsonl:4: unknown event `ev: warp_drive`"
    );
}

#[test]
fn rows_that_disagree_with_strided_are_rejected() {
    let mut lines = fixture_text(CASE_10_12_8);
    let line = lines
        .iter()
        .position(|l| l.contains(r#""handle":2,"#) && l.contains(r#""ev":"dlist""#))
        .unwrap();
    let file = read_trace(&case_trace(CASE_10_12_8)).unwrap();
    let TraceEvent::Dlist(d) = &file.lines[line].event else {
        panic!("line {line} is not a dlist");
    };
    let mut rows: Vec<[u64; 3]> = d
        .list
        .rows()
        .map(|r| [r.addr, r.len, u64::from(r.dev)])
        .collect();
    let mut value: serde_json::Value = serde_json::from_str(&lines[line]).unwrap();
    value["rows"] = serde_json::json!(rows);
    let agreeing = value.to_string();
    rows[30][0] += 1;
    value["rows"] = serde_json::json!(rows);
    lines[line] = agreeing;
    assert!(parse_lines(&lines).is_ok());
    lines[line] = value.to_string();
    let err = parse_lines(&lines).unwrap_err();
    assert_eq!(err.line, Some(line + 1));
    assert!(
        matches!(err.kind, TraceErrorKind::RowMismatch { handle: 2, row: 30, strided, rows }
            if rows.addr == strided.addr + 1),
        "{err}"
    );
}

#[test]
fn case_level_problems_are_typed() {
    let lines = fixture_text(CASE_10_12_8);
    let without_result: Vec<String> = lines[..lines.len() - 1].to_vec();
    let parsed = parse_lines(&without_result).unwrap();
    let err = TraceCase::from_lines(Path::new("bad.jsonl"), &parsed).unwrap_err();
    assert!(
        matches!(err.kind, TraceErrorKind::MissingEvent("result")),
        "{err}"
    );

    let mut twice = lines.clone();
    twice.push(lines[lines.len() - 1].replace(r#""seq":18"#, r#""seq":19"#));
    let parsed = parse_lines(&twice).unwrap();
    let err = TraceCase::from_lines(Path::new("bad.jsonl"), &parsed).unwrap_err();
    assert_eq!(
        err.to_string(),
        "bad.jsonl:20: a second `result` event (only one is supported)"
    );

    let mut other_agent = lines.clone();
    other_agent[16] = other_agent[16].replace(r#""agent":0"#, r#""agent":1"#);
    let parsed = parse_lines(&other_agent).unwrap();
    let err = TraceCase::from_lines(Path::new("bad.jsonl"), &parsed).unwrap_err();
    assert!(
        matches!(
            err.kind,
            TraceErrorKind::SeveralAgents {
                expected: 0,
                found: 1
            }
        ),
        "{err}"
    );
    assert_eq!(err.line, Some(17));

    let mut bad_handle = lines.clone();
    bad_handle[15] = bad_handle[15].replace(r#""local_handle":2"#, r#""local_handle":9"#);
    let parsed = parse_lines(&bad_handle).unwrap();
    let err = TraceCase::from_lines(Path::new("bad.jsonl"), &parsed).unwrap_err();
    assert_eq!(
        err.to_string(),
        "bad.jsonl:16: xfer refers to local handle 9, which no earlier dlist prepared"
    );
}

#[test]
fn files_on_disk_report_path_and_line_through_gzip() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("bad-traces");
    std::fs::create_dir_all(&dir).unwrap();
    let mut lines = fixture_text(MULTI_READ);
    lines[2] = r#"{"seq":2,"ev":"nixl_agent"}"#.to_string();
    let path = dir.join("missing-field.jsonl.gz");
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut enc, (lines.join("\n") + "\n").as_bytes()).unwrap();
    std::fs::write(&path, enc.finish().unwrap()).unwrap();
    let err = read_trace(&path).unwrap_err();
    assert_eq!(err.path, path);
    assert_eq!(err.line, Some(3));
    assert!(
        matches!(&err.kind, TraceErrorKind::BadEvent { ev: "nixl_agent", message } if message.contains("agent")),
        "{err}"
    );
    let missing = read_trace(&dir.join("absent.jsonl")).unwrap_err();
    assert!(matches!(missing.kind, TraceErrorKind::Read(_)));
}
