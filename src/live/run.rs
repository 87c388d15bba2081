//! Live cases: kvgeom prepares each case's memory exactly as its own
//! scenario does, the driver runs vLLM's connector on it, and kvgeom judges
//! vLLM's real final memory with every oracle.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde::Serialize;

use crate::connector::NamedPolicy;
use crate::layout::{CaseLayout, RequestBlocks, Side};
use crate::memory::HostArena;
use crate::nixl::recording::ResolvedPair;
use crate::nixl::{AgentId, DescRow, XferOp};
use crate::oracle::{self, MemoryImages, OracleInput, OraclePair};
use crate::pattern::{self, DecodeFill};
use crate::scenario::engines::allocate_ranks;
use crate::scenario::placement::place;
use crate::scenario::run::{
    check_prefix_hit, computed_blocks, judge, run_case_detailed, zero_decode_at_allocation,
};
use crate::scenario::{Case, CaseReport, Outcome, RunOptions, Stats};
use crate::scheduler::request_shape;
use crate::variant::Variant;

use super::blocks::{self, BlockCheck, BlocksComparison, EngineBlocks, PairBlocks};
use super::error::BatchError;
use super::post_process_calls::{first_call_difference, kvgeom_calls, vllm_calls, CallKey};
use super::process::run_bounded;
use super::protocol::{
    memory_file, Batch, CaseResult, CaseSpec, SideSpec, BATCH_FORMAT, RESULT_FORMAT,
};
use super::python::{driver_script, Interpreter};

/// Time the driver may take to import vLLM before its first case.
pub const IMPORT_LIMIT: Duration = Duration::from_secs(240);
/// Default time-out of one case inside the driver.
pub const CASE_LIMIT: Duration = Duration::from_secs(10);

/// The driver's exit status when the installed vLLM lacks a class or method
/// it needs (`vllm-driver/api_check.py`); it names each on stderr.
const MISSING_API_STATUS: i32 = 3;

/// Why a case's `result.json` is unusable.
#[derive(Debug, thiserror::Error)]
enum ResultFileError {
    #[error("{}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {source}", path.display())]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{}: format {found} is not {RESULT_FORMAT}", path.display())]
    Format { path: PathBuf, found: String },
    #[error("{}: the driver reports nixl {ran}, {asked} was asked for", path.display())]
    Nixl {
        path: PathBuf,
        asked: &'static str,
        ran: String,
    },
}

/// Why vLLM's recorded transfers cannot be resolved to pairs.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ResolveError {
    #[error("transfer {xfer}: unknown operation {op}")]
    UnknownOperation { xfer: usize, op: String },
    #[error("transfer {xfer}: unknown {which} list {handle}")]
    UnknownList {
        xfer: usize,
        /// `local` or `remote`.
        which: &'static str,
        handle: u64,
    },
}

/// vLLM's transfers compared with kvgeom's plan under `--policy vllm-0.33.0`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PlanComparison {
    /// vLLM posted exactly the pairs kvgeom plans.
    pub equal: bool,
    /// The first pair (or list) that differs, when not equal.
    pub first_difference: Option<String>,
}

/// One live case: its report (judged on vLLM's final memory) and the plan comparison.
pub struct LiveReport {
    /// The case judged on vLLM's real final memory.
    pub report: CaseReport,
    /// vLLM's transfers against kvgeom's plan.
    pub plan: PlanComparison,
    /// What the driver returned, for `explain` and the tests.
    pub result: Option<CaseResult>,
    /// What the oracles judged, for `explain`.
    pub oracle_input: Option<OracleInput>,
    /// vLLM's blocks against the geometry's, for a geometry that names its
    /// model config (`None` for any other).
    pub blocks: Option<BlocksComparison>,
    /// For a vLLM other than the pinned one: vLLM's transfers against
    /// kvgeom's own connector (`--policy kvgeom`) as well; `None` for the
    /// pinned vLLM, which [`plan`](Self::plan) alone judges.
    pub plan_kvgeom: Option<PlanComparison>,
}

/// A case's memory as kvgeom's scenario prepares it.
pub(crate) struct Prepared {
    pub(crate) layout: CaseLayout,
    pub(crate) transferred_tokens: u32,
    /// Arena bases `[rank][region]` per side: prefill, decode.
    pub(crate) bases: [Vec<Vec<u64>>; 2],
    /// Initial images `[rank][region]` per side.
    pub(crate) before: [Vec<Vec<Vec<u8>>>; 2],
    pub(crate) spec: CaseSpec,
}

impl Prepared {
    /// Bytes of the case's initial memory, every region of every rank.
    pub(super) fn memory_bytes(&self) -> u64 {
        self.before
            .iter()
            .flatten()
            .flatten()
            .map(|region| region.len() as u64)
            .sum()
    }
}

pub(crate) fn side_index(side: Side) -> usize {
    match side {
        Side::Prefill => 0,
        Side::Decode => 1,
    }
}

/// Shape, placement, allocation, provenance pattern, neighbours and
/// alloc-time zeroing: the same steps and bytes as `scenario::run`.
pub(crate) fn prepare(case: &Case, id: &str) -> Result<Prepared, Outcome> {
    let geometry = &case.geometry;
    check_prefix_hit(geometry, case.prompt_len, case.prefix_hit).map_err(Outcome::error)?;
    let shape = request_shape(geometry, case.prompt_len, case.prefix_hit, case.allocation);
    let placement = place(geometry, &shape, case.seed).map_err(|e| Outcome::Error {
        message: e.to_string(),
    })?;
    let (p_arenas, d_arenas) = allocate_ranks(geometry, &placement).map_err(Outcome::error)?;
    let bases = |a: &[Vec<HostArena>]| -> Vec<Vec<u64>> {
        a.iter()
            .map(|r| r.iter().map(HostArena::base).collect())
            .collect()
    };
    let blocks = RequestBlocks::with_prefix_hit(
        &geometry.model,
        geometry.decode.logical_block,
        placement.decode.clone(),
        placement.prefill.clone(),
        case.prefix_hit,
    );
    let layout = CaseLayout::from_bases(
        (**geometry).clone(),
        case.mode,
        blocks.clone(),
        bases(&d_arenas),
        placement.decode_pool,
        bases(&p_arenas),
        placement.prefill_pool,
    )
    .map_err(|e| Outcome::Error {
        message: format!("layout model: {e}"),
    })?;
    for (rank, arenas) in p_arenas.iter().enumerate() {
        pattern::fill_prefill_arenas(&layout, rank as u32, arenas).map_err(|e| Outcome::Error {
            message: e.to_string(),
        })?;
    }
    for (rank, arenas) in d_arenas.iter().enumerate() {
        pattern::fill_decode_arenas(
            &layout,
            rank as u32,
            arenas,
            DecodeFill::SentinelWithNeighbours,
        )
        .map_err(|e| Outcome::Error {
            message: e.to_string(),
        })?;
    }
    let decode: Vec<&[HostArena]> = d_arenas.iter().map(Vec::as_slice).collect();
    zero_decode_at_allocation(&decode, geometry, &shape, &placement);
    let images = |a: &[Vec<HostArena>]| -> Vec<Vec<Vec<u8>>> {
        a.iter()
            .map(|r| r.iter().map(HostArena::snapshot).collect())
            .collect()
    };
    let side_spec = |side: Side, pool: u32, request: Vec<Vec<u32>>| {
        let engine = match side {
            Side::Prefill => &geometry.prefill,
            Side::Decode => &geometry.decode,
        };
        let page = engine.unified_page_bytes(&geometry.model);
        SideSpec {
            tp_size: engine.tp_size,
            num_logical_blocks: pool,
            page_bytes: page,
            regions: geometry.model.layer_slots,
            region_bytes: u64::from(pool) * page,
            request_blocks: request,
            transfer_blocks: Vec::new(),
            computed_blocks: Vec::new(),
        }
    };
    let mut decode_spec = side_spec(Side::Decode, placement.decode_pool, blocks.decode.clone());
    decode_spec.transfer_blocks = blocks.decode_transfer.clone();
    decode_spec.computed_blocks = computed_blocks(&blocks);
    let spec = CaseSpec {
        id: id.to_string(),
        dir: id.to_string(),
        mode: case.mode.as_str().to_string(),
        prompt_len: case.prompt_len,
        prefix_hit: case.prefix_hit,
        transferred_tokens: shape.transferred_tokens,
        allocation: case.allocation,
        seed: case.seed,
        geometry: (**geometry).clone(),
        prefill: side_spec(
            Side::Prefill,
            placement.prefill_pool,
            blocks.prefill.clone(),
        ),
        decode: decode_spec,
        skip_receive_post_process: false,
        block_in_case: false,
    };
    Ok(Prepared {
        layout,
        transferred_tokens: shape.transferred_tokens,
        bases: [bases(&p_arenas), bases(&d_arenas)],
        before: [images(&p_arenas), images(&d_arenas)],
        spec,
    })
}

pub(super) fn write_inputs(dir: &Path, prepared: &Prepared) -> Result<(), BatchError> {
    let case_dir = dir.join(&prepared.spec.dir);
    std::fs::create_dir_all(&case_dir).map_err(|source| BatchError::CreateDir {
        path: case_dir.clone(),
        source,
    })?;
    for side in [Side::Prefill, Side::Decode] {
        for (rank, regions) in prepared.before[side_index(side)].iter().enumerate() {
            for (region, bytes) in regions.iter().enumerate() {
                let path = memory_file(
                    &case_dir,
                    &side.agent_name(rank as u32),
                    region as u32,
                    "in",
                );
                std::fs::write(&path, bytes)
                    .map_err(|source| BatchError::Write { path, source })?;
            }
        }
    }
    Ok(())
}

/// What a batch keeps of each judged case beyond its report and plan
/// comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Retention {
    /// The driver's result and the oracle input (every rank's memory
    /// images), for `explain` and the tests.
    Everything,
    /// Neither: a sweep's memory then stays within one driver batch.
    Verdicts,
}

/// Faults a test injects into the driver, and where traces are saved.
#[derive(Clone, Debug, Default)]
pub struct Hooks {
    /// Save each case's v2 trace into this folder (created if missing).
    pub record_traces: Option<PathBuf>,
    /// Skip vLLM's receive post-process on every case.
    pub skip_receive_post_process: bool,
    /// Indices of push cases whose thread the driver leaves blocked inside
    /// the case (the driver's time-out and restart).
    pub block_cases: Vec<usize>,
}

/// Remove a scratch folder, unless `KVGEOM_KEEP_LIVE` asks to keep it.
pub(super) fn remove_unless_kept(dir: &Path) {
    if std::env::var_os("KVGEOM_KEEP_LIVE").is_none() {
        let _ = std::fs::remove_dir_all(dir);
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn run_chunk(
    dir: &Path,
    cases: &[Case],
    prepared: Vec<Result<Prepared, Outcome>>,
    checks: &[BlockCheck],
    python: &Interpreter,
    case_limit: Duration,
    retention: Retention,
    record_traces: Option<&Path>,
) -> Result<Vec<LiveReport>, BatchError> {
    std::fs::create_dir_all(dir).map_err(|source| BatchError::CreateDir {
        path: dir.to_path_buf(),
        source,
    })?;
    let batch = Batch {
        format: BATCH_FORMAT,
        case_timeout_s: case_limit.as_secs_f64(),
        cases: prepared
            .iter()
            .filter_map(|p| p.as_ref().ok().map(|p| p.spec.clone()))
            .collect(),
        block_checks: checks
            .iter()
            .enumerate()
            .map(|(i, c)| c.spec(format!("b{i}")))
            .collect(),
        nixl: python.nixl.as_str(),
        trace_memory_limit: record_traces.map(|_| super::traces::TRACE_MEMORY_LIMIT),
    };
    let text = serde_json::to_string(&batch).map_err(BatchError::Encode)?;
    let batch_file = dir.join("batch.json");
    std::fs::write(&batch_file, text).map_err(|source| BatchError::Write {
        path: batch_file,
        source,
    })?;
    let script = driver_script();
    if !script.is_file() {
        return Err(BatchError::DriverMissing { script });
    }
    let mut cmd = Command::new(&python.python);
    cmd.arg(&script).arg(dir);
    let limit = IMPORT_LIMIT + case_limit * (batch.cases.len() as u32 + 1);
    let done = run_bounded(cmd, &dir.join("driver"), limit)?;
    if done.status != Some(0) && !done.timed_out() {
        if let Some(message) = super::error::memory_failure(&done.stderr) {
            return Err(BatchError::DriverOutOfMemory {
                python: python.python.clone(),
                message,
                limit: super::error::address_space_limit(),
            });
        }
    }
    if done.status == Some(MISSING_API_STATUS) {
        return Err(BatchError::MissingApi {
            python: python.python.clone(),
            vllm_version: python.vllm_version.clone(),
            missing: done
                .stderr
                .lines()
                .filter_map(|l| l.trim_start().strip_prefix("- "))
                .map(str::to_string)
                .collect(),
        });
    }
    if done.status == Some(super::nixl::UNAVAILABLE_STATUS) {
        return Err(BatchError::NixlUnavailable {
            python: python.python.clone(),
            message: done
                .stderr
                .lines()
                .rev()
                .find_map(|l| l.strip_prefix("driver: real NIXL: "))
                .map(|l| l.split("; install the nixl wheels").next().unwrap_or(l))
                .unwrap_or("the driver's probe failed")
                .to_string(),
        });
    }
    if done.status != Some(0) && !done.timed_out() {
        return Err(BatchError::DriverFailed {
            python: python.python.clone(),
            status: done.status,
            stderr_tail: done.stderr_tail(15),
        });
    }
    let killed = done.timed_out();
    if let Some(to) = record_traces {
        let case_dirs: Vec<Option<&str>> = prepared
            .iter()
            .map(|p| p.as_ref().ok().map(|p| p.spec.dir.as_str()))
            .collect();
        super::traces::save_traces(dir, cases, &case_dirs, to)?;
    }
    let case_under = |case: &Case, policy| Case {
        variant: Variant::Policy(policy),
        ..case.clone()
    };
    let mut out = Vec::new();
    for (case, p) in cases.iter().zip(prepared) {
        // The case carries the reference policy (the code under test's).
        let reference = run_case_detailed(case, &RunOptions::default());
        let reference_plan = match &reference.oracle_input {
            Some(input) => Ok(plan_keys(input)),
            None => Err(reference.report.outcome.clone()),
        };
        let reference_calls = kvgeom_calls(&reference, case.geometry.model.is_mla());
        let live = match p {
            Err(outcome) => LiveReport {
                plan: not_run(&outcome.describe()),
                report: report(case, judge(&case.geometry, case.mode, outcome, &[])),
                result: None,
                oracle_input: None,
                blocks: None,
                plan_kvgeom: None,
            },
            Ok(p) => judge_case(
                dir,
                case,
                p,
                killed,
                (&reference_plan, &reference_calls),
                python.nixl.as_str(),
            ),
        };
        // A vLLM kvgeom does not model is compared with kvgeom's policy too.
        let live = if python.reference.is_some() || live.result.is_none() {
            live
        } else {
            let own = run_case_detailed(
                &case_under(case, NamedPolicy::Kvgeom),
                &RunOptions::default(),
            );
            let own_plan = match &own.oracle_input {
                Some(input) => Ok(plan_keys(input)),
                None => Err(own.report.outcome.clone()),
            };
            let vllm_plan = match &live.oracle_input {
                Some(input) => Ok(plan_keys(input)),
                None => Err(live.report.outcome.clone()),
            };
            let own_calls = kvgeom_calls(&own, case.geometry.model.is_mla());
            let plan = compare_plans(&own_plan, &vllm_plan);
            let plan = match &live.result {
                Some(result) if vllm_plan.is_ok() => with_post_process(plan, result, &own_calls),
                _ => plan,
            };
            LiveReport {
                plan_kvgeom: Some(plan),
                ..live
            }
        };
        out.push(match retention {
            Retention::Everything => live,
            Retention::Verdicts => LiveReport {
                result: None,
                oracle_input: None,
                ..live
            },
        });
    }
    let compared = compare_blocks(dir, checks, killed);
    for live in &mut out {
        live.blocks = compared
            .iter()
            .find(|(name, _)| *name == live.report.case.geometry_name())
            .map(|(_, c)| c.clone());
    }
    Ok(out)
}

/// Each check's geometry name and its comparison with what the driver's
/// `blocks.json` says vLLM chose.
fn compare_blocks(
    dir: &Path,
    checks: &[BlockCheck],
    killed: bool,
) -> Vec<(String, BlocksComparison)> {
    if checks.is_empty() {
        return Vec::new();
    }
    let vllm = blocks::read_blocks(&dir.join("blocks.json"));
    checks
        .iter()
        .enumerate()
        .map(|(i, check)| {
            let g = &check.geometry;
            let ours = PairBlocks {
                prefill: EngineBlocks::of(g, &g.prefill),
                decode: EngineBlocks::of(g, &g.decode),
            };
            let comparison = match &vllm {
                Ok(all) => match all.get(&format!("b{i}")) {
                    Some(theirs) => blocks::compare(&ours, theirs),
                    None => blocks::not_derived(&ours, "the driver returned no blocks for it"),
                },
                Err(_) if killed => {
                    blocks::not_derived(&ours, "the vLLM driver was stopped at its time-out")
                }
                Err(e) => blocks::not_derived(&ours, &e.to_string()),
            };
            (g.name.clone(), comparison)
        })
        .collect()
}

fn report(case: &Case, outcome: Outcome) -> CaseReport {
    CaseReport {
        case: case.clone(),
        outcome,
        stats: Stats::default(),
        violations: Vec::new(),
    }
}

fn parse_side(s: Option<&str>) -> Side {
    match s {
        Some("prefill") => Side::Prefill,
        _ => Side::Decode,
    }
}

fn read_result(case_dir: &Path, nixl: &'static str) -> Result<CaseResult, ResultFileError> {
    let path = case_dir.join("result.json");
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(source) => return Err(ResultFileError::Read { path, source }),
    };
    let r: CaseResult = match serde_json::from_str(&text) {
        Ok(r) => r,
        Err(source) => return Err(ResultFileError::Parse { path, source }),
    };
    if r.format != RESULT_FORMAT {
        return Err(ResultFileError::Format {
            path,
            found: r.format,
        });
    }
    // A driver from before `nixl` in results ran the stand-in.
    if r.nixl.as_deref().unwrap_or("stand-in") != nixl {
        return Err(ResultFileError::Nixl {
            path,
            asked: nixl,
            ran: r
                .nixl
                .as_deref()
                .unwrap_or("(none: the stand-in)")
                .to_string(),
        });
    }
    Ok(r)
}

fn judge_case(
    dir: &Path,
    case: &Case,
    p: Prepared,
    killed: bool,
    (reference_plan, reference_calls): (&Result<Vec<String>, Outcome>, &[CallKey]),
    nixl: &'static str,
) -> LiveReport {
    let case_dir = dir.join(&p.spec.dir);
    let result = match read_result(&case_dir, nixl) {
        Ok(r) => r,
        Err(e) => {
            let outcome = if killed {
                Outcome::Hung {
                    message:
                        "the vLLM driver was stopped at its time-out before this case finished"
                            .into(),
                }
            } else {
                Outcome::Error {
                    message: format!("the vLLM driver left no result: {e}"),
                }
            };
            return LiveReport {
                plan: not_run(&outcome.describe()),
                report: report(case, outcome),
                result: None,
                oracle_input: None,
                blocks: None,
                plan_kvgeom: None,
            };
        }
    };
    let message = result.message.clone().unwrap_or_default();
    let side = parse_side(result.side.as_deref());
    let outcome = match result.status.as_str() {
        "done" => Outcome::Passed,
        "rejected" => Outcome::UnexpectedRejection { side, message },
        "crashed" => Outcome::Crashed { side, message },
        "hung" => Outcome::Hung { message },
        _ => Outcome::Error {
            message: format!("vLLM driver: {message}"),
        },
    };
    if let Outcome::Error { message } = &outcome {
        return LiveReport {
            report: report(case, outcome.clone()),
            plan: not_run(message),
            result: Some(result),
            oracle_input: None,
            blocks: None,
            plan_kvgeom: None,
        };
    }
    if outcome != Outcome::Passed {
        let plan = compare_plans(reference_plan, &Err(outcome.clone()));
        return LiveReport {
            report: report(case, judge(&case.geometry, case.mode, outcome, &[])),
            plan,
            result: Some(result),
            oracle_input: None,
            blocks: None,
            plan_kvgeom: None,
        };
    }
    let pairs = match resolve_pairs(&result, &p) {
        Ok(pairs) => pairs,
        Err(e) => {
            return LiveReport {
                report: report(case, Outcome::error(e)),
                plan: not_run("its transfers could not be resolved"),
                result: Some(result),
                oracle_input: None,
                blocks: None,
                plan_kvgeom: None,
            }
        }
    };
    let mut input = OracleInput::new(p.layout.clone(), case.prompt_len, case.prefix_hit, pairs)
        .with_transferred_tokens(p.transferred_tokens);
    let [p_before, d_before] = p.before;
    for (side, before) in [(Side::Prefill, p_before), (Side::Decode, d_before)] {
        for (rank, before) in before.into_iter().enumerate() {
            let agent = side.agent_name(rank as u32);
            let mut after = Vec::new();
            for (region, initial) in before.iter().enumerate() {
                let path = memory_file(&case_dir, &agent, region as u32, "out");
                match std::fs::read(&path) {
                    Ok(bytes) if bytes.len() == initial.len() => after.push(bytes.into()),
                    Ok(bytes) => {
                        let message = format!(
                            "{}: {} bytes, expected {}",
                            path.display(),
                            bytes.len(),
                            initial.len()
                        );
                        return LiveReport {
                            report: report(case, Outcome::Error { message }),
                            plan: not_run("no final memory"),
                            result: Some(result),
                            oracle_input: None,
                            blocks: None,
                            plan_kvgeom: None,
                        };
                    }
                    Err(e) => {
                        let message = format!("final memory {}: {e}", path.display());
                        return LiveReport {
                            report: report(case, Outcome::Error { message }),
                            plan: not_run("no final memory"),
                            result: Some(result),
                            oracle_input: None,
                            blocks: None,
                            plan_kvgeom: None,
                        };
                    }
                }
            }
            input.set_memory(
                side,
                rank as u32,
                MemoryImages {
                    before: before.into(),
                    after,
                },
            );
        }
    }
    let violations = oracle::run_all(&input);
    let posted: Vec<&OraclePair> = input.posted_pairs().collect();
    let stats = Stats {
        pairs: posted.len() as u64,
        transferred_bytes: posted.iter().map(|p| p.destination.row.len).sum(),
        zeroed_bytes: 0,
        // vLLM owns the tensors: kvgeom's estimate of its own run does not apply.
        memory_bytes: 0,
    };
    let plan = with_post_process(
        compare_plans(reference_plan, &Ok(plan_keys(&input))),
        &result,
        reference_calls,
    );
    let outcome = judge(&case.geometry, case.mode, Outcome::Passed, &violations);
    LiveReport {
        report: CaseReport {
            case: case.clone(),
            outcome,
            stats,
            violations,
        },
        plan,
        result: Some(result),
        oracle_input: Some(input),
        blocks: None,
        plan_kvgeom: None,
    }
}

/// vLLM's addresses moved onto kvgeom's arenas: same region, same offset.
pub(crate) fn relocate(result: &CaseResult, p: &Prepared, agent: &str, row: DescRow) -> DescRow {
    let Some((side, rank)) = Side::parse_agent_name(agent) else {
        return row;
    };
    let kvgeom = &p.bases[side_index(side)];
    if let (Some(vllm), Some(ours)) = (result.regions.get(agent), kvgeom.get(rank as usize)) {
        for (i, &(base, len)) in vllm.iter().enumerate() {
            if row.addr >= base && row.addr < base + len {
                if let Some(&to) = ours.get(i) {
                    return DescRow {
                        addr: to + (row.addr - base),
                        ..row
                    };
                }
            }
        }
    }
    row
}

pub(crate) fn resolve_pairs(
    result: &CaseResult,
    p: &Prepared,
) -> Result<Vec<ResolvedPair<crate::layout::Location>>, ResolveError> {
    let lists: HashMap<(&str, u64), &super::protocol::DlistRecord> = result
        .dlists
        .iter()
        .map(|d| ((d.agent.as_str(), d.handle), d))
        .collect();
    let mut out = Vec::new();
    for (xi, x) in result.xfers.iter().enumerate() {
        let op = match x.op.as_str() {
            "READ" => XferOp::Read,
            "WRITE" => XferOp::Write,
            other => {
                return Err(ResolveError::UnknownOperation {
                    xfer: xi,
                    op: other.to_string(),
                })
            }
        };
        let list = |which: &'static str, handle: u64| {
            lists
                .get(&(x.agent.as_str(), handle))
                .ok_or(ResolveError::UnknownList {
                    xfer: xi,
                    which,
                    handle,
                })
        };
        let local = list("local", x.local)?;
        let remote = list("remote", x.remote)?;
        let remote_agent = remote.target.clone();
        for (pi, (&l, &r)) in x.local_ids.iter().zip(&x.remote_ids).enumerate() {
            let (Some(&lr), Some(&rr)) = (local.rows.get(l as usize), remote.rows.get(r as usize))
            else {
                continue;
            };
            let lrow = relocate(
                result,
                p,
                &x.agent,
                DescRow {
                    addr: lr.0,
                    len: lr.1,
                    dev: lr.2,
                },
            );
            let rrow = relocate(
                result,
                p,
                &remote_agent,
                DescRow {
                    addr: rr.0,
                    len: rr.1,
                    dev: rr.2,
                },
            );
            out.push(ResolvedPair {
                xfer: xi,
                pair: pi,
                op,
                initiator: AgentId(0),
                remote_agent: remote_agent.clone(),
                local: lrow,
                remote: rrow,
                local_location: p.layout.classify_named(&x.agent, lrow),
                remote_location: p.layout.classify_named(&remote_agent, rrow),
                posted: x.posted,
            });
        }
    }
    Ok(out)
}

/// Where a row lies, independent of addresses: `agent rREGION+OFFSET/LEN`.
pub(crate) fn place_of(layout: &CaseLayout, row: DescRow) -> String {
    for side in [Side::Prefill, Side::Decode] {
        for engine in layout.engines(side) {
            if let Some((region, offset)) = engine.locate(row.addr, row.len) {
                return format!("{} r{region}+{offset}/{}", engine.agent_name(), row.len);
            }
        }
    }
    format!("unregistered {:#x}/{}", row.addr, row.len)
}

/// Every posted pair as `op source -> destination` (agent, region, offset
/// and length of each end), sorted.
pub fn plan_keys(input: &OracleInput) -> Vec<String> {
    let mut keys: Vec<String> = input
        .posted_pairs()
        .map(|p| {
            format!(
                "{:?} {} -> {}",
                p.op,
                place_of(&input.case, p.source.row),
                place_of(&input.case, p.destination.row)
            )
        })
        .collect();
    keys.sort();
    keys
}

/// No comparison: vLLM's connector did not run the case (a driver or
/// harness error), which never counts as agreeing.
fn not_run(why: &str) -> PlanComparison {
    PlanComparison {
        equal: false,
        first_difference: Some(format!("vLLM's connector did not run the case: {why}")),
    }
}

/// kvgeom's plan against vLLM's transfers: each the posted pairs
/// ([`plan_keys`]), or the outcome of a run that made none.
/// How a run that made no transfers ended, for comparing two of them: a
/// refusal (expected or not: the geometry judges that), a crash, a hang, or
/// another ending by its label.
fn stop_kind(outcome: &Outcome) -> &'static str {
    match outcome {
        Outcome::UnexpectedRejection { .. } | Outcome::ExpectedRejection { .. } => "rejected",
        other => other.label(),
    }
}

/// `plan`, unequal from the first difference of the post-process calls
/// when the pairs were equal (both runs moved bytes): vLLM's in `result`,
/// kvgeom's `calls`.
fn with_post_process(
    plan: PlanComparison,
    result: &CaseResult,
    calls: &[CallKey],
) -> PlanComparison {
    if !plan.equal {
        return plan;
    }
    match first_call_difference(result, calls, &vllm_calls(result)) {
        Some(d) => PlanComparison {
            equal: false,
            first_difference: Some(d),
        },
        None => plan,
    }
}

pub(crate) fn compare_plans(
    kvgeom: &Result<Vec<String>, Outcome>,
    vllm: &Result<Vec<String>, Outcome>,
) -> PlanComparison {
    let first_difference = match (kvgeom, vllm) {
        (Err(k), Err(v)) if stop_kind(k) != stop_kind(v) => Some(format!(
            "kvgeom's connector stops ({}); vLLM stops otherwise ({})",
            k.describe(),
            v.describe()
        )),
        (Err(_), Err(_)) => None,
        (Ok(k), Err(v)) => Some(format!(
            "kvgeom's plan moves {} pairs; vLLM made no transfers ({})",
            k.len(),
            v.describe()
        )),
        (Err(k), Ok(v)) => Some(format!(
            "kvgeom's connector stops ({}); vLLM moved {} pairs",
            k.describe(),
            v.len()
        )),
        (Ok(k), Ok(v)) => {
            let at = k.iter().zip(v).position(|(a, b)| a != b);
            match at {
                Some(i) => Some(format!("pair {i}: kvgeom {} ; vLLM {}", k[i], v[i])),
                None if k.len() != v.len() => Some(format!(
                    "kvgeom's plan has {} pairs, vLLM's {}",
                    k.len(),
                    v.len()
                )),
                None => None,
            }
        }
    };
    PlanComparison {
        equal: first_difference.is_none(),
        first_difference,
    }
}

#[cfg(test)]
mod tests {
    use super::compare_plans;
    use crate::layout::Side;
    use crate::scenario::Outcome;

    fn crashed() -> Outcome {
        Outcome::Crashed {
            side: Side::Decode,
            message: "IndexError".into(),
        }
    }

    #[test]
    fn two_runs_without_transfers_are_equal_only_when_they_end_alike() {
        let refused = |expected: bool| {
            let (side, message) = (Side::Decode, "refused".to_string());
            if expected {
                Outcome::ExpectedRejection { side, message }
            } else {
                Outcome::UnexpectedRejection { side, message }
            }
        };
        assert!(compare_plans(&Err(crashed()), &Err(crashed())).equal);
        assert!(compare_plans(&Err(refused(true)), &Err(refused(false))).equal);
        let differ = compare_plans(&Err(crashed()), &Err(refused(false)));
        assert!(!differ.equal);
        assert!(differ
            .first_difference
            .unwrap()
            .contains("vLLM stops otherwise"));
        let hung = Outcome::Hung {
            message: "waits".into(),
        };
        assert!(!compare_plans(&Err(hung), &Err(crashed())).equal);
    }

    #[test]
    fn plans_differ_at_their_first_unequal_pair() {
        let k = Ok(vec!["a".to_string(), "b".to_string()]);
        let v = Ok(vec!["a".to_string(), "c".to_string()]);
        let d = compare_plans(&k, &v);
        assert_eq!(
            d.first_difference.as_deref(),
            Some("pair 1: kvgeom b ; vLLM c")
        );
        assert!(!compare_plans(&k, &Err(crashed())).equal);
    }
}
