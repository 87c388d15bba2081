//! Live cases: kvgeom prepares each case's memory exactly as its own
//! scenario does, the driver runs vLLM's connector on it, and each case's
//! driver output goes to the caller's judge while the driver's folder still
//! holds its final memory (`live::connector` turns it into a run record for the judge).

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::layout::{CaseLayout, RequestBlocks, Side};
use crate::memory::ArenaBytes;
use crate::scenario::run::computed_blocks;
use crate::scenario::{
    prepare_placed_memory, shape_and_place, Case, Outcome, Placed, Placement, PreparedMemory,
};
use crate::scheduler::RequestShape;

use super::blocks::{self, BlockCheck, BlocksComparison, EngineBlocks, PairBlocks};
use super::error::BatchError;
use super::protocol::{
    memory_file, Batch, CaseResult, CaseSpec, SideSpec, BATCH_FORMAT, RESULT_FORMAT,
};
use super::python::{driver_script, Interpreter};

pub use super::limits::{CASE_LIMIT, IMPORT_LIMIT};
use crate::driver::{run_driver, TRACE_MEMORY_LIMIT};

/// Why a case's `result.json` is unusable.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ResultFileError {
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

/// A case's memory as kvgeom's scenario prepares it.
pub struct Prepared {
    pub(crate) layout: CaseLayout,
    pub(crate) transferred_tokens: u32,
    /// Arena bases `[rank][region]` per side: prefill, decode.
    pub(crate) bases: [Vec<Vec<u64>>; 2],
    /// Initial images `[rank][region]` per side.
    pub(crate) before: [Vec<Vec<Vec<u8>>>; 2],
    pub(crate) spec: CaseSpec,
    /// A scheduler case's place folder: its `place.json` and metadata
    /// pickle go into the case's run folder.
    pub(crate) place_dir: Option<PathBuf>,
}

impl Prepared {
    /// Bytes of the case's initial memory, every region of every rank.
    pub(crate) fn memory_bytes(&self) -> u64 {
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

/// kvgeom's preparation of the case's memory (`scenario::prepare_memory`)
/// and the case as the driver reads it.
pub(crate) fn prepare(case: &Case, id: &str) -> Result<Prepared, Outcome> {
    prepare_placed(case, shape_and_place(case), id)
}

/// The case as the driver reads it (and as a trace records it), for a
/// placed request, without its memory: kvgeom's trace writer records its
/// own run with it and never prepares the memory again.
pub(crate) fn spec_without_memory(
    case: &Case,
    placed: Placed,
    id: &str,
) -> Result<CaseSpec, Outcome> {
    let (shape, placement) = placed?;
    let blocks = RequestBlocks::with_prefix_hit(
        &case.geometry.model,
        case.geometry.decode.logical_block,
        placement.decode.clone(),
        placement.prefill.clone(),
        case.prefix_hit,
    );
    let computed = computed_blocks(&blocks);
    Ok(case_spec(case, &shape, &placement, &blocks, computed, id))
}

fn case_spec(
    case: &Case,
    shape: &RequestShape,
    placement: &Placement,
    blocks: &RequestBlocks,
    computed_blocks: Vec<u32>,
    id: &str,
) -> CaseSpec {
    let geometry = &case.geometry;
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
    decode_spec.computed_blocks = computed_blocks;
    CaseSpec {
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
        requests: super::protocol::RequestPath::Direct,
    }
}

/// [`prepare`] for the placement a connector under test gave the case (or
/// why it has none).
pub(crate) fn prepare_placed(case: &Case, placed: Placed, id: &str) -> Result<Prepared, Outcome> {
    let (shape, placement) = placed?;
    let PreparedMemory {
        layout,
        shape,
        placement,
        blocks,
        computed_blocks,
        bases,
        before,
    } = prepare_placed_memory(case, shape, placement)?;
    let spec = case_spec(case, &shape, &placement, &blocks, computed_blocks, id);
    Ok(Prepared {
        layout,
        transferred_tokens: shape.transferred_tokens,
        bases,
        before,
        spec,
        place_dir: None,
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
    if let Some(from) = &prepared.place_dir {
        super::place::copy_place_files(from, &case_dir)?;
    }
    Ok(())
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
    /// How the requests are made (default: every case direct).
    pub requests: super::place::Requests,
}

/// Remove a scratch folder, unless `KVGEOM_KEEP_LIVE` asks to keep it.
pub(super) fn remove_unless_kept(dir: &Path) {
    crate::driver::remove_unless_kept(dir, "KVGEOM_KEEP_LIVE");
}

/// One case of a chunk the driver ran, handed to the judge while the
/// chunk's folder still holds the driver's output.
pub struct DriverCase<'a> {
    /// The case.
    pub case: &'a Case,
    /// kvgeom's preparation of its memory, or why there is none.
    pub prepared: Result<Prepared, Outcome>,
    /// The case's folder: its `result.json` and final memory files.
    pub case_dir: PathBuf,
    /// The driver was stopped at its time-out.
    pub killed: bool,
    /// What moved the bytes (`stand-in` or `real`).
    pub nixl: &'static str,
    /// vLLM's blocks against the geometry's, for a checked geometry.
    pub blocks: Option<BlocksComparison>,
    /// How the case's request reached vLLM's workers.
    pub request_path: super::place::RequestPath,
    /// A scheduler case's place phase: kvgeom's scheduler model against
    /// vLLM's, the place folder, its cost.
    pub scheduler: Option<super::place::SchedulerInfo>,
}

/// How the caller judges each case of a chunk.
pub type JudgeDriverCase<'a, T> = dyn Fn(DriverCase<'_>) -> T + Sync + 'a;

/// Why a case's final memory files are unusable.
#[derive(Debug, thiserror::Error)]
pub enum FinalMemoryError {
    /// A file of another length than the region's.
    #[error("{}: {found} bytes, expected {expected}", path.display())]
    Length {
        /// The file.
        path: PathBuf,
        /// Its bytes.
        found: usize,
        /// The region's.
        expected: usize,
    },
    /// A file that cannot be read.
    #[error("final memory {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// Every rank's final memory as the driver wrote it, `[side][rank][region]`,
/// each file as long as kvgeom's initial image of the region.
pub(crate) fn read_final_memory(
    case_dir: &Path,
    p: &Prepared,
) -> Result<[Vec<Vec<ArenaBytes>>; 2], FinalMemoryError> {
    let mut out: [Vec<Vec<ArenaBytes>>; 2] = [Vec::new(), Vec::new()];
    for side in [Side::Prefill, Side::Decode] {
        for (rank, before) in p.before[side_index(side)].iter().enumerate() {
            let agent = side.agent_name(rank as u32);
            let mut after = Vec::new();
            for (region, initial) in before.iter().enumerate() {
                let path = memory_file(case_dir, &agent, region as u32, "out");
                match std::fs::read(&path) {
                    Ok(bytes) if bytes.len() == initial.len() => after.push(bytes.into()),
                    Ok(bytes) => {
                        return Err(FinalMemoryError::Length {
                            path,
                            found: bytes.len(),
                            expected: initial.len(),
                        })
                    }
                    Err(source) => return Err(FinalMemoryError::Read { path, source }),
                }
            }
            out[side_index(side)].push(after);
        }
    }
    Ok(out)
}

/// Run one chunk's cases in one driver process and hand each case to
/// `judge`, in order, while the chunk's folder holds the driver's output.
#[allow(clippy::too_many_arguments)]
pub(super) fn run_chunk<T>(
    dir: &Path,
    cases: &[Case],
    prepared: Vec<Result<Prepared, Outcome>>,
    checks: &[BlockCheck],
    python: &Interpreter,
    case_limit: Duration,
    record_traces: Option<&Path>,
    scheduler: &[Option<super::place::SchedulerInfo>],
    judge: &JudgeDriverCase<'_, T>,
) -> Result<Vec<T>, BatchError> {
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
        trace_memory_limit: record_traces.map(|_| TRACE_MEMORY_LIMIT),
    };
    super::place::write_batch_file(dir, &batch)?;
    let limit = IMPORT_LIMIT + case_limit * (batch.cases.len() as u32 + 1);
    let run = python.driver_run();
    let done = run_driver(
        &run,
        &driver_script(),
        &[dir.as_os_str()],
        &dir.join("driver"),
        limit,
    )?;
    let killed = done.timed_out();
    if let Some(to) = record_traces {
        let case_dirs: Vec<Option<&str>> = prepared
            .iter()
            .map(|p| p.as_ref().ok().map(|p| p.spec.dir.as_str()))
            .collect();
        super::traces::save_traces(dir, cases, &case_dirs, to)?;
    }
    let compared = compare_blocks(dir, checks, killed);
    let nixl = python.nixl.as_str();
    Ok(cases
        .iter()
        .zip(prepared)
        .enumerate()
        .map(|(i, (case, prepared))| {
            let scheduler = scheduler.get(i).cloned().flatten();
            let case_dir = match &prepared {
                Ok(p) => dir.join(&p.spec.dir),
                Err(_) => dir.to_path_buf(),
            };
            let blocks = compared
                .iter()
                .find(|(name, _)| *name == case.geometry_name())
                .map(|(_, c)| c.clone());
            judge(DriverCase {
                case,
                prepared,
                case_dir,
                killed,
                nixl,
                blocks,
                request_path: if scheduler.is_some() {
                    super::place::RequestPath::Scheduler
                } else {
                    super::place::RequestPath::Direct
                },
                scheduler,
            })
        })
        .collect())
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

pub(crate) fn read_result(
    case_dir: &Path,
    nixl: &'static str,
) -> Result<CaseResult, ResultFileError> {
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::{prepare, prepare_placed};
    use crate::geometry::{fixtures, Mode};
    use crate::scenario::{shape_and_place, Case};
    use crate::scheduler::DecodeAllocation;
    use crate::variant::Variant;

    fn case(seed: u64) -> Case {
        Case {
            geometry: Arc::new(fixtures::g1()),
            file: None,
            prompt_len: 37,
            prefix_hit: 0,
            mode: Mode::Pull,
            allocation: DecodeAllocation::Mainline,
            seed,
            variant: Variant::KVGEOM,
        }
    }

    #[test]
    fn a_case_is_prepared_for_the_placement_the_connector_gave_it() {
        let (ours, theirs) = (case(1), case(2));
        let (_, their_placement) = shape_and_place(&theirs).expect("placed");
        let own = prepare(&ours, "c0").expect("prepared");
        let given = prepare_placed(&ours, shape_and_place(&theirs), "c0").expect("prepared");
        // The two seeds place the request elsewhere, so the test can fail.
        assert_ne!(own.spec.decode.request_blocks, their_placement.decode);
        assert_eq!(given.spec.decode.request_blocks, their_placement.decode);
        assert_eq!(given.spec.prefill.request_blocks, their_placement.prefill);
        assert_eq!(given.layout.blocks().decode, their_placement.decode);
    }

    #[test]
    fn a_case_whose_placement_failed_is_not_prepared() {
        let why = crate::scenario::Outcome::error("no room");
        let got = prepare_placed(&case(1), Err(why.clone()), "c0");
        assert_eq!(got.err(), Some(why));
    }
}
