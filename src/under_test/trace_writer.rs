//! Writing kvgeom's own run of a case as a recorded trace (`kvgeom-trace/3`,
//! docs/trace-format.md): the run record serialised in the layout the live
//! driver's v2 traces use (the case as the driver would be given it, the
//! connector's registrations, lists, transfers and receive post-process
//! calls as a driver's result, each region's memory before and after),
//! plus what ran (`code_under_test`). `check-trace`, `diff-trace` and
//! `sweep --connector replay` read it as they read a v2 trace.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use super::CodeUnderTest;
use crate::connector::post_process::{asks_for_conversion, zeroed_ranges};
use crate::layout::Side;
use crate::live::protocol::{CaseResult, DlistRecord, PostProcessCall, XferRecord, RESULT_FORMAT};
use crate::live::run::{prepare, side_index, Prepared};
use crate::live::TRACE_MEMORY_LIMIT;
use crate::nixl::recording::Event;
use crate::nixl::{DlistTarget, MemKind, XferOp};
use crate::oracle::RankMemory;
use crate::scenario::{CaseRun, Outcome};
use crate::trace::base64;

/// The `format` of a trace that records its code under test.
pub const TRACE_FORMAT_V3: &str = "kvgeom-trace/3";

/// Why a run cannot be written as a trace.
#[derive(Debug, thiserror::Error)]
pub enum TraceWriteError {
    /// kvgeom cannot prepare the case again (the trace's case and initial
    /// memory are its preparation).
    #[error("{path}: kvgeom cannot prepare the case: {reason}", path = path.display())]
    Prepare {
        /// The trace that was to be written.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The file cannot be written.
    #[error("{path}: {source}", path = path.display())]
    Write {
        /// The trace.
        path: PathBuf,
        /// The write's error.
        #[source]
        source: std::io::Error,
    },
}

/// The driver's `status`, `side` and `message` for how kvgeom's run ended
/// (before the geometry's expectations judged it).
fn status_of(outcome: &Outcome) -> (&'static str, Option<Side>, Option<String>) {
    match outcome {
        Outcome::Passed | Outcome::Violations | Outcome::MissingRejection { .. } => {
            ("done", None, None)
        }
        Outcome::UnexpectedRejection { side, message }
        | Outcome::ExpectedRejection { side, message } => {
            ("rejected", Some(*side), Some(message.clone()))
        }
        Outcome::Crashed { side, message } => ("crashed", Some(*side), Some(message.clone())),
        Outcome::Hung { message } => ("hung", None, Some(message.clone())),
        Outcome::Error { message } => ("error", None, Some(message.clone())),
    }
}

fn mem_name(mem: MemKind) -> &'static str {
    match mem {
        MemKind::Dram => "DRAM",
        MemKind::Vram => "VRAM",
    }
}

/// kvgeom's run as a driver's result: each agent's regions, every list
/// and transfer the recording transport logged, and one receive
/// post-process call per decode rank that planned any group.
fn result_of(run: &CaseRun) -> CaseResult {
    let (status, side, message) = status_of(&run.report.outcome);
    let mut result = CaseResult {
        format: RESULT_FORMAT.to_string(),
        status: status.to_string(),
        side: side.map(|s| s.as_str().to_string()),
        message,
        regions: BTreeMap::new(),
        dlists: Vec::new(),
        xfers: Vec::new(),
        post_process: Vec::new(),
        post_process_calls: Vec::new(),
        region_zero_calls: Vec::new(),
        handshakes: Vec::new(),
        nixl: None,
        nixl_version: None,
        failures: Vec::new(),
        raised: Vec::new(),
        notifs: Vec::new(),
        trace: None,
    };
    let Some(recording) = &run.recording else {
        return result;
    };
    let name = |agent| recording.name_of(agent).unwrap_or("?").to_string();
    for event in recording.events() {
        match event {
            Event::RegisterMemory { agent, regions } => {
                let entry = result.regions.entry(name(*agent)).or_default();
                entry.extend(regions.iter().map(|r| (r.addr, r.len)));
            }
            Event::Dlist {
                agent,
                handle,
                target,
                mem,
                list,
            } => result.dlists.push(DlistRecord {
                agent: name(*agent),
                handle: handle.0,
                target: match target {
                    DlistTarget::Local => "local".to_string(),
                    DlistTarget::Remote(peer) => peer.clone(),
                },
                mem: mem_name(*mem).to_string(),
                rows: list.rows().map(|r| (r.addr, r.len, r.dev)).collect(),
            }),
            _ => {}
        }
    }
    for x in recording.xfers() {
        result.xfers.push(XferRecord {
            agent: name(x.agent),
            op: match x.op {
                XferOp::Read => "READ",
                XferOp::Write => "WRITE",
            }
            .to_string(),
            local: handle_of(recording.events(), x.agent, x.handle, true),
            local_ids: x.local_ids.to_vec(),
            remote: handle_of(recording.events(), x.agent, x.handle, false),
            remote_ids: x.remote_ids.to_vec(),
            posted: x.posted,
        });
    }
    let is_mla = run.report.case.geometry.model.is_mla();
    for (rank, plans) in run.post_process.iter().filter(|(_, p)| !p.is_empty()) {
        let agent = Side::Decode.agent_name(*rank);
        let geometries = run
            .decode_page_geometries
            .get(*rank as usize)
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        let bases = result.regions.get(&agent).cloned().unwrap_or_default();
        let zeroed = zeroed_ranges(plans, geometries)
            .into_iter()
            .filter_map(|(region, offset, len)| Some((bases.get(region)?.0 + offset, len)))
            .collect();
        let ratio = plans[0].ratio;
        result.post_process_calls.push(PostProcessCall {
            agent,
            block_size_ratio: ratio,
            block_ids_list: plans
                .iter()
                .map(|p| (p.group as u32, p.block_ids.clone(), p.covered_sub_blocks))
                .collect(),
            convert: asks_for_conversion(is_mla, ratio),
            zeroed: Some(zeroed),
        });
    }
    result
}

/// The local (or remote) list handle of transfer `handle` of `agent`.
fn handle_of(
    events: &[Event],
    agent: crate::nixl::AgentId,
    handle: crate::nixl::XferHandle,
    local_list: bool,
) -> u64 {
    events
        .iter()
        .find_map(|e| match e {
            Event::Xfer {
                agent: a,
                handle: h,
                local,
                remote,
                ..
            } if *a == agent && *h == handle => Some(if local_list { local.0 } else { remote.0 }),
            _ => None,
        })
        .unwrap_or_default()
}

/// Every region's bytes before (kvgeom's preparation) and after the run,
/// when the case's initial memory is at most [`TRACE_MEMORY_LIMIT`] and the
/// run left final memory.
fn memory_of(run: &CaseRun, prepared: &Prepared) -> Option<Value> {
    let input = run.oracle_input.as_ref()?;
    let initial: u64 = prepared
        .before
        .iter()
        .flatten()
        .flatten()
        .map(|r| r.len() as u64)
        .sum();
    if initial > TRACE_MEMORY_LIMIT {
        return None;
    }
    let mut images = Vec::new();
    for side in [Side::Prefill, Side::Decode] {
        for (rank, regions) in prepared.before[side_index(side)].iter().enumerate() {
            let rank = rank as u32;
            let after: Option<&[crate::memory::ArenaBytes]> = match input.rank_memory(side, rank)? {
                RankMemory::Images(m) => Some(&m.after),
                RankMemory::Untouched(_) => None,
            };
            for (region, before) in regions.iter().enumerate() {
                let after_bytes: &[u8] = match after {
                    Some(after) => after.get(region)?,
                    None => before,
                };
                images.push(json!({
                    "agent": side.agent_name(rank),
                    "region": region,
                    "before": base64::encode(before),
                    "after": base64::encode(after_bytes),
                }));
            }
        }
    }
    Some(json!({ "encoding": "base64", "images": images }))
}

/// kvgeom's run of a case (`run_case_detailed`'s) as a trace: its JSON.
pub fn trace_of(
    run: &CaseRun,
    code: &CodeUnderTest,
    path: &Path,
) -> Result<Value, TraceWriteError> {
    let case = &run.report.case;
    let id = crate::live::trace_file_name(case);
    let prepared = prepare(case, &id).map_err(|o| TraceWriteError::Prepare {
        path: path.to_path_buf(),
        reason: o.describe(),
    })?;
    let mut spec = serde_json::to_value(&prepared.spec).unwrap_or(Value::Null);
    if let Some(map) = spec.as_object_mut() {
        map.remove("dir");
    }
    let mut trace = json!({
        "format": TRACE_FORMAT_V3,
        "code_under_test": code,
        "case": spec,
        "result": result_of(run),
    });
    if let Some(memory) = memory_of(run, &prepared) {
        trace["memory"] = memory;
    }
    Ok(trace)
}

/// Write kvgeom's run of a case as a trace at `path` (gzipped when the name
/// ends in `.gz`).
pub fn write_trace(
    run: &CaseRun,
    code: &CodeUnderTest,
    path: &Path,
) -> Result<(), TraceWriteError> {
    use std::io::Write;
    let text = trace_of(run, code, path)?.to_string();
    let write = || -> std::io::Result<()> {
        let file = std::fs::File::create(path)?;
        if path.extension().is_some_and(|e| e == "gz") {
            let mut gz = flate2::write::GzEncoder::new(file, flate2::Compression::default());
            gz.write_all(text.as_bytes())?;
            gz.finish()?.sync_all()
        } else {
            let mut file = file;
            file.write_all(text.as_bytes())?;
            file.sync_all()
        }
    };
    write().map_err(|source| TraceWriteError::Write {
        path: path.to_path_buf(),
        source,
    })
}
