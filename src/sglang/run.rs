//! Judging a case SGLang's own transfer ran: its driver result and final
//! memory (the batch's files, handed over by connector.rs, or a recorded
//! trace) checked against kvgeom's model of SGLang's pools, then the
//! oracles. Driver statuses: `done` is judged by [`super::oracles`];
//! `rejected` is SGLang's refusal (held to the geometry's
//! `expect_rejection`); `crashed` and `hung` are those outcomes; `error`
//! (the driver could not build the case) is the case's error. A NIXL
//! refusal (containment: a descriptor outside registered memory) makes the
//! case crashed, naming the refusal and the SGLang function that asked.

use std::path::PathBuf;

use super::batch::{self, Prepared};
use super::error::JudgeError;
use super::final_memory::{FinalMemory, ImageKind};
use super::images::Placement;
use super::layout::EnginePools;
use super::oracles::{self, Images, Observed};
use super::result::{DriverResult, Region};
use super::state::{self, StateImages, StatePools};
use crate::layout::Side;
use crate::oracle::no_double_write::RedundantWrites;
use crate::scenario::{Case, CaseReport, Stats};
use crate::under_test::judge::expected_outcome;
use crate::under_test::RunOutcome;

/// Seconds a case may take inside the driver before it is `hung`.
pub const CASE_TIMEOUT_S: u64 = 20;

/// Why a batch could not run at all (exit 2).
#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    /// The batch folder or a case's files could not be written.
    #[error("cannot prepare the SGLang batch in {}: {source}", dir.display())]
    Write {
        /// The folder.
        dir: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The driver could not run the batch: missing, not started, short of
    /// memory, an SGLang whose API differs from what `sglang-driver/`
    /// drives, real NIXL unavailable, or a failure before any case wrote
    /// its result (a broken interpreter, no SGLang).
    #[error(transparent)]
    Driver(#[from] crate::driver::DriverError),
    /// A case's trace could not be written.
    #[error("{0}")]
    Trace(#[from] super::trace_file::SglangTraceError),
}

/// Where a sweep records its cases as traces (`--record-traces DIR`,
/// `explain --record-trace FILE`).
#[derive(Clone, Debug)]
pub enum TraceTarget {
    /// One gzipped trace per case in the folder, named by its case.
    Folder(PathBuf),
    /// The one case's trace at this path (gzipped when it ends in `.gz`).
    File(PathBuf),
}

impl TraceTarget {
    /// Where the trace of `case` goes.
    pub fn path_of(&self, case: &Case) -> PathBuf {
        match self {
            TraceTarget::Folder(dir) => {
                dir.join(format!("{}.gz", crate::driver::trace_file_name(case)))
            }
            TraceTarget::File(path) => path.clone(),
        }
    }
}

/// One judged SGLang case.
#[derive(Clone, Debug)]
pub struct SglangCase {
    /// The case's report, as every connector's.
    pub report: CaseReport,
    /// Decode bytes written again with the bytes they already held
    /// (replicated prefill ranks each writing a shared head): no violation.
    pub redundant_write_bytes: u64,
    /// Posted pairs that wrote only such bytes.
    pub redundant_writes: u64,
    /// The driver's versions of SGLang and torch, when it ran the case.
    pub versions: Option<(String, String)>,
    /// Ranks whose registered regions (count, order, what, length, page
    /// length) were compared with kvgeom's model of SGLang's pools, and
    /// agreed (a disagreement makes the case an error).
    pub layout_checked: u32,
}

fn report(case: &Case, outcome: RunOutcome, stats: Stats, judged: oracles::Judged) -> CaseReport {
    let outcome = expected_outcome(
        &case.geometry,
        case.mode,
        outcome.to_outcome(),
        &judged.violations,
    );
    CaseReport {
        case: case.clone(),
        outcome,
        stats,
        violations: judged.violations,
    }
}

fn not_run(case: &Case, message: String) -> SglangCase {
    not_judged(case, RunOutcome::NotRun { message })
}

/// A case that ended without a driver result to judge (`outcome` says how),
/// as the sweep reports it.
pub fn not_judged(case: &Case, outcome: RunOutcome) -> SglangCase {
    SglangCase {
        report: report(case, outcome, Stats::default(), oracles::Judged::default()),
        redundant_write_bytes: 0,
        redundant_writes: 0,
        versions: None,
        layout_checked: 0,
    }
}

fn side_of(side: Option<&str>) -> Side {
    match side {
        Some(s) if s.starts_with("prefill") => Side::Prefill,
        _ => Side::Decode,
    }
}

/// The driver's status as the connector's ending; a NIXL refusal makes it
/// a crash naming the refusal.
pub fn outcome_of(r: &DriverResult) -> RunOutcome {
    let message = r.message.clone().unwrap_or_default();
    if let Some(first) = r.refusals.first() {
        if r.status != "rejected" && r.status != "error" {
            let function = first.function().unwrap_or("an unknown caller");
            return RunOutcome::Crashed {
                side: side_of(Some(&first.agent)),
                message: format!(
                    "NIXL refused {} descriptor(s) asked for by SGLang's {function} ({}): {}{}",
                    r.refusals.len(),
                    first.agent,
                    first.reason,
                    if message.is_empty() {
                        String::new()
                    } else {
                        format!("; SGLang: {message}")
                    }
                ),
            };
        }
    }
    let side = side_of(r.side.as_deref());
    RunOutcome::from_driver_status(&r.status, side, message, |other, message| {
        format!("SGLang driver ({other}): {message}")
    })
}

/// Where kvgeom's model of a rank's regions differs from SGLang's.
pub fn region_mismatch(pools: &EnginePools, rank: u32, found: &[Region]) -> Option<String> {
    let model = pools.regions(rank);
    let agent = format!("{}-{rank}", pools.side);
    if model.len() != found.len() {
        return Some(format!(
            "{agent}: kvgeom models {} regions, SGLang registered {}",
            model.len(),
            found.len()
        ));
    }
    for (m, f) in model.iter().zip(found) {
        let mine = (m.index, m.what(), m.len, m.item_len);
        let theirs = (f.index, f.what.clone(), f.len, f.item_len);
        if mine != theirs {
            return Some(format!(
                "{agent}: kvgeom models region {} as {} of {} bytes, pages of {}; SGLang's is {} of {} bytes, pages of {}",
                m.index, mine.1, mine.2, mine.3, theirs.1, theirs.2, theirs.3
            ));
        }
    }
    None
}

/// Compare every rank the driver built (and reports regions of) with
/// kvgeom's model: how many agreed, or the first disagreement.
pub fn check_layout(p: &Prepared, r: &DriverResult) -> Result<u32, JudgeError> {
    let mut checked = 0;
    for pools in [&p.prefill, &p.decode] {
        for rank in 0..pools.attn_tp {
            let agent = format!("{}-{rank}", pools.side);
            let Some(found) = r.agents.get(&agent).filter(|a| !a.regions.is_empty()) else {
                continue;
            };
            if let Some(why) = region_mismatch(pools, rank, &found.regions) {
                return Err(JudgeError::Layout(why));
            }
            checked += 1;
        }
    }
    Ok(checked)
}

fn read_images(mem: &dyn FinalMemory, pools: &EnginePools) -> Result<Images, JudgeError> {
    (0..pools.attn_tp)
        .map(|rank| {
            let agent = format!("{}-{rank}", pools.side);
            pools
                .regions(rank)
                .iter()
                .map(|r| mem.image(&agent, ImageKind::Region, r.index, r.len))
                .collect()
        })
        .collect()
}

/// Judge the driver's result `r` of `case` (prepared as `p`), its final
/// memory read from `mem`: the layout checks, the status, then the oracles.
pub fn judge_result(
    case: &Case,
    p: &Prepared,
    r: &DriverResult,
    mem: &dyn FinalMemory,
) -> SglangCase {
    let versions = Some((
        r.sglang.clone().unwrap_or_else(|| "unknown".into()),
        r.torch.clone().unwrap_or_else(|| "unknown".into()),
    ));
    let layout_checked = match check_layout(p, r) {
        Ok(n) => n,
        Err(e) => {
            return SglangCase {
                versions,
                ..not_run(case, e.to_string())
            }
        }
    };
    let layout_checked = match &p.state {
        Some((ps, ds)) => match state::check_state_layout(ps, r)
            .and_then(|a| Ok(a + state::check_state_layout(ds, r)?))
        {
            Ok(_) => layout_checked,
            Err(e) => {
                return SglangCase {
                    versions,
                    ..not_run(
                        case,
                        format!(
                            "kvgeom's model of SGLang's state pools disagrees with SGLang's: {e}"
                        ),
                    )
                }
            }
        },
        None => layout_checked,
    };
    let outcome = outcome_of(r);
    let (writes, _unresolved) = r.kv_writes();
    let mut stats = Stats {
        pairs: writes.len() as u64,
        transferred_bytes: writes.iter().map(|w| w.len).sum(),
        zeroed_bytes: 0,
        memory_bytes: memory_bytes(p),
        redundant_writes: RedundantWrites::default(),
    };
    let mut judged = oracles::Judged::default();
    if outcome == RunOutcome::Completed {
        match observe(p, mem, r, writes) {
            Ok(o) => {
                judged = oracles::judge(&o);
                if let Some((ps, ds)) = &p.state {
                    match judge_state_of(p, ps, ds, mem, r) {
                        Ok(v) => judged.violations.extend(v),
                        Err(e) => {
                            return SglangCase {
                                versions,
                                layout_checked,
                                ..not_run(case, e.to_string())
                            }
                        }
                    }
                }
            }
            Err(e) => {
                return SglangCase {
                    versions,
                    layout_checked,
                    ..not_run(case, e.to_string())
                }
            }
        }
    }
    if judged.redundant_pairs > 0 {
        stats.redundant_writes = RedundantWrites {
            pairs: judged.redundant_pairs,
            bytes: judged.redundant_bytes,
            multiplicity: judged.most_writers,
        };
    }
    SglangCase {
        layout_checked,
        redundant_write_bytes: judged.redundant_bytes,
        redundant_writes: judged.redundant_pairs,
        report: report(case, outcome, stats, judged),
        versions,
    }
}

fn read_state_images(mem: &dyn FinalMemory, pools: &StatePools) -> Result<StateImages, JudgeError> {
    if !mem.has_images() {
        return Ok(Vec::new());
    }
    (0..pools.attn_tp)
        .map(|rank| {
            let agent = format!("{}-{rank}", pools.side);
            pools
                .tensors(rank)
                .iter()
                .map(|t| mem.image(&agent, ImageKind::State, t.index, t.len()))
                .collect()
        })
        .collect()
}

/// The state oracles of a hybrid case; state regions are numbered after
/// the KV regions in the violations.
fn judge_state_of(
    p: &Prepared,
    ps: &StatePools,
    ds: &StatePools,
    mem: &dyn FinalMemory,
    r: &DriverResult,
) -> Result<Vec<crate::oracle::Violation>, JudgeError> {
    let prefill_after = read_state_images(mem, ps)?;
    let decode_after = read_state_images(mem, ds)?;
    let prefill_before = batch::prefill_state_images(ps);
    let writes = state::state_writes(r);
    let base = p.decode.regions(0).len() as u32;
    Ok(state::judge_state(
        &state::StateObserved {
            prefill: ps,
            decode: ds,
            prefill_before: &prefill_before,
            prefill_after: &prefill_after,
            decode_after: &decode_after,
            writes: &writes,
        },
        base,
    ))
}

fn memory_bytes(p: &Prepared) -> u64 {
    [&p.prefill, &p.decode]
        .iter()
        .map(|e| {
            (0..e.attn_tp)
                .flat_map(|r| e.regions(r))
                .map(|r| r.len)
                .sum::<u64>()
        })
        .sum()
}

fn observe(
    p: &Prepared,
    mem: &dyn FinalMemory,
    r: &DriverResult,
    writes: Vec<super::result::Write>,
) -> Result<Observed, JudgeError> {
    for pools in [&p.prefill, &p.decode] {
        for rank in 0..pools.attn_tp {
            let agent = format!("{}-{rank}", pools.side);
            let found = r
                .agents
                .get(&agent)
                .map(|a| a.regions.as_slice())
                .ok_or_else(|| JudgeError::NoAgent {
                    agent: agent.clone(),
                })?;
            if let Some(why) = region_mismatch(pools, rank, found) {
                return Err(JudgeError::Layout(why));
            }
        }
    }
    Ok(Observed {
        prefill_before: batch::prefill_images(p),
        prefill_after: if mem.has_images() {
            read_images(mem, &p.prefill)?
        } else {
            Vec::new()
        },
        decode_after: if mem.has_images() {
            read_images(mem, &p.decode)?
        } else {
            Vec::new()
        },
        prefill: p.prefill.clone(),
        decode: p.decode.clone(),
        placement: Placement::clone(&p.placement),
        writes,
    })
}

/// Judge a recorded trace as the sweep judged its case.
pub fn judge_trace(t: &super::trace_file::SglangTrace) -> SglangCase {
    judge_result(&t.case, &t.prepared, &t.result, t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sglang::result::{Refusal, RESULT_FORMAT};

    fn result(status: &str, side: Option<&str>, message: &str) -> DriverResult {
        DriverResult {
            format: RESULT_FORMAT.into(),
            status: status.into(),
            side: side.map(str::to_string),
            message: Some(message.into()),
            ..DriverResult::default()
        }
    }

    #[test]
    fn driver_statuses_map_to_the_connectors_endings() {
        assert_eq!(outcome_of(&result("done", None, "")), RunOutcome::Completed);
        assert_eq!(
            outcome_of(&result("rejected", Some("decode-0"), "Page size mismatch")),
            RunOutcome::Refused {
                side: Side::Decode,
                reason: "Page size mismatch".into()
            }
        );
        assert_eq!(
            outcome_of(&result("crashed", Some("prefill"), "boom")),
            RunOutcome::Crashed {
                side: Side::Prefill,
                message: "boom".into()
            }
        );
        assert!(matches!(
            outcome_of(&result("hung", None, "waits")),
            RunOutcome::Hung { .. }
        ));
        assert!(matches!(
            outcome_of(&result("error", None, "cannot build")),
            RunOutcome::NotRun { message } if message.contains("cannot build")
        ));
    }

    #[test]
    fn a_nixl_refusal_is_a_crash_naming_it_and_the_sglang_function() {
        let mut r = result("done", None, "");
        r.refusals.push(Refusal {
            agent: "prefill-0".into(),
            reason: "NIXL_ERR_NOT_FOUND: prep_xfer_dlist: row 2".into(),
            caller: serde_json::json!({"sglang": {"function": "_prep_xfer_dlist"}}),
        });
        match outcome_of(&r) {
            RunOutcome::Crashed { side, message } => {
                assert_eq!(side, Side::Prefill);
                assert!(message.contains("NIXL_ERR_NOT_FOUND"), "{message}");
                assert!(message.contains("SGLang's _prep_xfer_dlist"), "{message}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_region_unlike_the_model_is_named_and_a_case_replays_on_sglang() {
        let case = crate::sglang::one_layer_test_case(5, 7);
        assert_eq!(
            case.replay_command(),
            "kvgeom explain --connector sglang geometries/sglang/x.toml --prompt 5 --seed 7"
        );
        let pools = EnginePools::of(&case.geometry, Side::Decode, 3).expect("pools");
        let mut regions: Vec<Region> = pools
            .regions(0)
            .iter()
            .map(|m| Region {
                index: m.index,
                what: m.what(),
                addr: 0,
                len: m.len,
                item_len: m.item_len,
            })
            .collect();
        assert_eq!(region_mismatch(&pools, 0, &regions), None);
        regions[1].item_len /= 2;
        let why = region_mismatch(&pools, 0, &regions).expect("differs");
        assert!(
            why.contains("decode-0") && why.contains("V layer 0"),
            "{why}"
        );
        regions.pop();
        assert!(region_mismatch(&pools, 0, &regions).is_some());
    }
}
