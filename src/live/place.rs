//! Requests made by vLLM's own scheduler (`--requests scheduler`): the
//! driver's place phase (`driver.py --place`, vllm-driver/README.md
//! "Scheduler requests") runs vLLM's v1 scheduler, KV cache manager and the
//! NIXL connector's scheduler half on each case; each case's `place.json`
//! becomes the placement kvgeom prepares the memory for, and is compared
//! with kvgeom's own model of the scheduler (`src/scheduler.rs`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::layout::RequestBlocks;
use crate::scenario::run::alloc_zeroed_blocks;
use crate::scenario::{Case, Outcome, Placed, Placement};
use crate::scheduler::{request_shape, DecodeAllocation, RequestShape};

use super::error::BatchError;
use super::limits::{CASE_LIMIT, IMPORT_LIMIT};
use super::python::{driver_script, Interpreter};
use crate::driver::{run_driver, DriverError};

/// The `format` of a case's `place.json`.
pub const PLACE_FORMAT: &str = "kvgeom-vllm-place/1";
/// The place phase's file per case.
pub const PLACE_FILE: &str = "place.json";
/// The scheduler's connector metadata per case (opaque to kvgeom).
pub const META_FILE: &str = "scheduler_meta.pkl";
/// `status` of a case vLLM's scheduler placed.
const PLACED: &str = "placed";
/// `status` of a case vLLM's scheduler cannot make.
pub const NOT_REACHABLE: &str = "not reachable by vLLM's scheduler";
/// vLLM's null block: a placeholder in a request's list, never its memory.
const NULL_BLOCK: u32 = 0;

pub use super::protocol::RequestPath;

/// How a batch's requests are made (`--requests`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Requests {
    /// Every case on the direct path (the library's default).
    #[default]
    Direct,
    /// Mainline cases by vLLM's scheduler; `with-last-token` cases, the
    /// allocation of vLLM's tests and not of its scheduler, direct.
    Scheduler,
}

impl Requests {
    /// The path `case` takes.
    pub fn path_of(self, case: &Case) -> RequestPath {
        match (self, case.allocation) {
            (Requests::Scheduler, DecodeAllocation::Mainline) => RequestPath::Scheduler,
            _ => RequestPath::Direct,
        }
    }
}

/// One case of the place phase's `batch.json`: what it reads.
#[derive(Serialize)]
struct PlaceCase<'a> {
    id: String,
    dir: String,
    mode: &'static str,
    requests: RequestPath,
    prompt_len: u32,
    prefix_hit: u32,
    allocation: DecodeAllocation,
    seed: u64,
    geometry: &'a crate::geometry::Geometry,
}

#[derive(Serialize)]
struct PlaceBatch<'a> {
    format: &'static str,
    case_timeout_s: f64,
    cases: Vec<PlaceCase<'a>>,
}

/// One engine of a placed case, as `place.json` states it.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
pub struct PlacedSide {
    /// The request's block ids per group (vLLM's null block included).
    #[serde(default)]
    pub request_blocks: Option<Vec<Vec<u32>>>,
    /// Decode: the blocks the transfer fills, per group.
    #[serde(default)]
    pub transfer_blocks: Option<Vec<Vec<u32>>>,
    /// The smallest pool that holds the request.
    pub needed_blocks: u32,
    /// The blocks vLLM zeroes when it allocates them.
    #[serde(default)]
    pub zeroed_at_alloc: Vec<u32>,
    /// Decode: the prefix-cache hit vLLM found, in tokens.
    #[serde(default)]
    pub local_hit_tokens: u32,
}

/// A case's `place.json` (`kvgeom-vllm-place/1`), the fields kvgeom reads.
#[derive(Clone, Debug, Deserialize)]
struct PlaceFile {
    format: String,
    status: String,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    message: Option<String>,
    #[serde(default)]
    tokens_to_transfer: Option<u32>,
    #[serde(default)]
    prefill: Option<PlacedSide>,
    #[serde(default)]
    decode: Option<PlacedSide>,
    #[serde(default)]
    seconds: Option<f64>,
}

/// kvgeom's scheduler model of a case against what vLLM's scheduler did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SchedulerComparison {
    /// Every quantity equal: tokens, blocks per group, zeroed blocks.
    pub equal: bool,
    /// Each quantity that differs: `NAME: vLLM X, kvgeom Y`.
    pub differences: Vec<String>,
}

/// What the place phase gave one scheduler case.
#[derive(Clone, Debug)]
pub struct SchedulerPlaced {
    /// The request as vLLM's scheduler placed it, or why it has none
    /// (not reachable, an error).
    pub placed: Placed,
    /// The rest of what the place phase gave.
    pub info: SchedulerInfo,
}

/// What the run and the judge keep of a scheduler case's place phase.
#[derive(Clone, Debug, Default)]
pub struct SchedulerInfo {
    /// The case's place folder: its `place.json` and metadata pickle.
    pub dir: PathBuf,
    /// kvgeom's model against vLLM's scheduler (placed cases only).
    pub model: Option<SchedulerComparison>,
    /// Seconds the place phase spent on the case (its own measure).
    pub seconds: Option<f64>,
    /// The placement vLLM's scheduler gave (placed cases): kvgeom's plan
    /// for the case is made for these blocks.
    pub placement: Option<(RequestShape, Placement)>,
    /// Each engine's `request_blocks` exactly as `place.json` lists them
    /// (vLLM's null placeholders included), `[prefill, decode]`: the batch
    /// names them so, and the run phase checks prefill's.
    pub listed_blocks: Option<[Vec<Vec<u32>>; 2]>,
}

/// Run the place phase on every case whose request `requests` gives to
/// vLLM's scheduler, in `dir` (one folder `c<i>` per case); per case,
/// `None` for a direct case. `Err` when the driver cannot run.
pub(crate) fn place_batch(
    dir: &Path,
    cases: &[Case],
    requests: Requests,
    python: &Interpreter,
) -> Result<Vec<Option<SchedulerPlaced>>, BatchError> {
    let chosen: Vec<usize> = (0..cases.len())
        .filter(|&i| requests.path_of(&cases[i]) == RequestPath::Scheduler)
        .collect();
    if chosen.is_empty() {
        return Ok(vec![None; cases.len()]);
    }
    std::fs::create_dir_all(dir).map_err(|source| BatchError::CreateDir {
        path: dir.to_path_buf(),
        source,
    })?;
    let batch = PlaceBatch {
        format: super::protocol::BATCH_FORMAT,
        case_timeout_s: CASE_LIMIT.as_secs_f64(),
        cases: chosen
            .iter()
            .map(|&i| {
                let c = &cases[i];
                PlaceCase {
                    id: format!("c{i}"),
                    dir: format!("c{i}"),
                    mode: c.mode.as_str(),
                    requests: RequestPath::Scheduler,
                    prompt_len: c.prompt_len,
                    prefix_hit: c.prefix_hit,
                    allocation: c.allocation,
                    seed: c.seed,
                    geometry: &c.geometry,
                }
            })
            .collect(),
    };
    write_batch_file(dir, &batch)?;
    let limit = IMPORT_LIMIT + Duration::from_secs(1) * (chosen.len() as u32 + 10);
    let run = python.driver_run();
    let args = ["--place".as_ref(), dir.as_os_str()];
    let done = run_driver(&run, &driver_script(), &args, &dir.join("driver"), limit)?;
    if done.timed_out() {
        // Every case's placement is needed before the run phase.
        return Err(DriverError::failed(&run, &done).into());
    }
    let mut out = vec![None; cases.len()];
    for i in chosen {
        let case_dir = dir.join(format!("c{i}"));
        out[i] = Some(read_place(&case_dir, &cases[i]));
    }
    Ok(out)
}

/// One case's `place.json` as kvgeom's placement (an unreadable file is
/// the case's harness error).
pub(crate) fn read_place(case_dir: &Path, case: &Case) -> SchedulerPlaced {
    let path = case_dir.join(PLACE_FILE);
    let parsed = std::fs::read_to_string(&path)
        .map_err(|e| format!("{}: {e}", path.display()))
        .and_then(|text| {
            serde_json::from_str::<PlaceFile>(&text).map_err(|e| format!("{}: {e}", path.display()))
        });
    let file = match parsed {
        Ok(f) if f.format == PLACE_FORMAT => f,
        Ok(f) => {
            return failed(
                case_dir,
                format!(
                    "{}: format {} is not {PLACE_FORMAT}",
                    path.display(),
                    f.format
                ),
            )
        }
        Err(e) => return failed(case_dir, format!("the place phase left no placement: {e}")),
    };
    let (placed, model) = placed_from(&file, case);
    SchedulerPlaced {
        placed,
        info: SchedulerInfo {
            dir: case_dir.to_path_buf(),
            model,
            seconds: file.seconds,
            placement: None,
            listed_blocks: file
                .prefill
                .as_ref()
                .zip(file.decode.as_ref())
                .map(|(p, d)| {
                    [
                        p.request_blocks.clone().unwrap_or_default(),
                        d.request_blocks.clone().unwrap_or_default(),
                    ]
                }),
        },
    }
}

fn failed(dir: &Path, message: String) -> SchedulerPlaced {
    SchedulerPlaced {
        placed: Err(Outcome::Error { message }),
        info: SchedulerInfo {
            dir: dir.to_path_buf(),
            ..SchedulerInfo::default()
        },
    }
}

/// `place.json`'s placement, checked, and kvgeom's model against it.
fn placed_from(file: &PlaceFile, case: &Case) -> (Placed, Option<SchedulerComparison>) {
    let outcome = |placed: Placed| (placed, None);
    match file.status.as_str() {
        PLACED => {}
        NOT_REACHABLE => {
            return outcome(Err(Outcome::NotReachable {
                reason: file
                    .reason
                    .clone()
                    .unwrap_or_else(|| "no reason given".into()),
            }))
        }
        "error" => {
            return outcome(Err(Outcome::Error {
                message: format!(
                    "vLLM's scheduler refused the case: {}",
                    file.message.as_deref().unwrap_or("(no message)")
                ),
            }))
        }
        other => {
            return outcome(Err(Outcome::Error {
                message: format!("place.json: unknown status {other:?}"),
            }))
        }
    }
    match scheduler_shape(file, case) {
        Ok((shape, placement)) => {
            let model = compare_model(case, &shape, file);
            (Ok((shape, placement)), Some(model))
        }
        Err(message) => outcome(Err(Outcome::Error {
            message: format!("place.json: {message}"),
        })),
    }
}

/// Why vLLM's placement of a case is not one kvgeom's model can hold.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlaceError {
    /// `place.json` lacks an engine or the tokens to transfer.
    #[error("a placed case without prefill, decode or tokens_to_transfer")]
    Incomplete,
    /// An engine holds blocks of another number of groups.
    #[error("{side} holds blocks of {found} groups, the geometry has {groups}")]
    Groups {
        /// `prefill` or `decode`.
        side: &'static str,
        /// The groups vLLM placed.
        found: usize,
        /// The geometry's groups.
        groups: usize,
    },
    /// vLLM's scheduler found another prefix hit than the case asks.
    #[error("vLLM's scheduler found a prefix hit of {found} tokens, the case asks for {asked}")]
    PrefixHit {
        /// vLLM's hit, in tokens.
        found: u32,
        /// The case's.
        asked: u32,
    },
    /// Decode loads into other blocks than the request's past the hit.
    #[error(
        "decode loads into {transfer:?}; the request's blocks {decode:?} past a hit of {hit} \
         tokens are {model:?}"
    )]
    Transfer {
        /// The blocks decode loads into, per group.
        transfer: Vec<Vec<u32>>,
        /// The request's decode blocks, per group.
        decode: Vec<Vec<u32>>,
        /// The prefix hit, in tokens.
        hit: u32,
        /// The request's blocks past the hit, per group.
        model: Vec<Vec<u32>>,
    },
    /// Decode zeroes other blocks at allocation than kvgeom's model can.
    #[error(
        "decode zeroes blocks {zeroed:?} at allocation; kvgeom's memory model can zero only \
         the request's last blocks ({ours:?} here)"
    )]
    Zeroed {
        /// vLLM's zeroed blocks, sorted.
        zeroed: Vec<u32>,
        /// kvgeom's, sorted.
        ours: Vec<u32>,
    },
}

/// The request's shape and blocks as vLLM's scheduler placed it: each
/// engine's blocks per group (decode's without vLLM's null placeholders),
/// pools that hold `needed_blocks`, and decode's zeroing at allocation.
fn scheduler_shape(file: &PlaceFile, case: &Case) -> Result<(RequestShape, Placement), PlaceError> {
    let geometry = &case.geometry;
    let groups = geometry.model.groups.len();
    let (Some(p), Some(d), Some(to_transfer)) =
        (&file.prefill, &file.decode, file.tokens_to_transfer)
    else {
        return Err(PlaceError::Incomplete);
    };
    let prefill = p.request_blocks.clone().unwrap_or_default();
    let decode_held = d.request_blocks.clone().unwrap_or_default();
    for (side, blocks) in [("prefill", &prefill), ("decode", &decode_held)] {
        if blocks.len() != groups {
            return Err(PlaceError::Groups {
                side,
                found: blocks.len(),
                groups,
            });
        }
    }
    // vLLM's null block is a placeholder in a group's list (a mamba group
    // with prefix caching lists it before its state slot), never the
    // request's memory.
    let prefill = without_null(&prefill);
    let decode = without_null(&decode_held);
    let hit = d.local_hit_tokens;
    if hit != case.prefix_hit {
        return Err(PlaceError::PrefixHit {
            found: hit,
            asked: case.prefix_hit,
        });
    }
    let blocks = RequestBlocks::with_prefix_hit(
        &geometry.model,
        geometry.decode.logical_block,
        decode.clone(),
        prefill.clone(),
        hit,
    );
    let transfer = d.transfer_blocks.clone().unwrap_or_default();
    if blocks.decode_transfer != transfer {
        return Err(PlaceError::Transfer {
            transfer,
            decode,
            hit,
            model: blocks.decode_transfer,
        });
    }
    let zeroed: Vec<u32> = {
        let mut z = d.zeroed_at_alloc.clone();
        z.sort_unstable();
        z.dedup();
        z
    };
    let zeroed_in = |g: &[u32]| g.iter().filter(|b| zeroed.binary_search(b).is_ok()).count() as u32;
    let shape = RequestShape {
        prompt_len: case.prompt_len,
        transferred_tokens: hit + to_transfer,
        prefix_hit: hit,
        decode_blocks: decode.iter().map(|g| g.len() as u32).collect(),
        decode_transfer_blocks: transfer.iter().map(|g| g.len() as u32).collect(),
        decode_unzeroed_blocks: transfer
            .iter()
            .map(|g| g.len() as u32 - zeroed_in(g))
            .collect(),
        prefill_blocks: prefill.iter().map(|g| g.len() as u32).collect(),
    };
    let count = |blocks: &[Vec<u32>]| blocks.iter().map(|g| g.len() as u32).sum::<u32>();
    let pool = |fixed: Option<u32>, blocks: &[Vec<u32>], needed: u32| {
        crate::scenario::placement::pool_size(fixed, count(blocks)).max(needed)
    };
    let placement = Placement {
        decode_pool: pool(geometry.decode.num_logical_blocks, &decode, d.needed_blocks),
        prefill_pool: pool(
            geometry.prefill.num_logical_blocks,
            &prefill,
            p.needed_blocks,
        ),
        decode,
        prefill,
    };
    // kvgeom zeroes the request's blocks the transfer does not fill, past
    // the hit: vLLM's must be those.
    let ours = alloc_zeroed_blocks(geometry, &shape, &placement);
    let mut ours_sorted = ours.clone();
    ours_sorted.sort_unstable();
    if ours_sorted != zeroed {
        return Err(PlaceError::Zeroed {
            zeroed,
            ours: ours_sorted,
        });
    }
    Ok((shape, placement))
}

/// Each group's blocks without vLLM's null block.
fn without_null(blocks: &[Vec<u32>]) -> Vec<Vec<u32>> {
    blocks
        .iter()
        .map(|g| g.iter().copied().filter(|&b| b != NULL_BLOCK).collect())
        .collect()
}

/// kvgeom's scheduler model (`request_shape`, mainline) against vLLM's:
/// the prompt tokens prefill computed (M), the tokens decode loads, each
/// engine's blocks per group, decode's transfer blocks and its blocks
/// zeroed at allocation per group.
fn compare_model(case: &Case, vllm: &RequestShape, file: &PlaceFile) -> SchedulerComparison {
    let geometry = &case.geometry;
    let ours = request_shape(
        geometry,
        case.prompt_len,
        case.prefix_hit,
        DecodeAllocation::Mainline,
    );
    let zeroed = |s: &RequestShape| -> Vec<u32> {
        s.decode_transfer_blocks
            .iter()
            .zip(&s.decode_unzeroed_blocks)
            .map(|(t, u)| t.saturating_sub(*u))
            .collect()
    };
    let mut differences = Vec::new();
    let mut check = |name: &str, theirs: String, mine: String| {
        if theirs != mine {
            differences.push(format!("{name}: vLLM {theirs}, kvgeom {mine}"));
        }
    };
    check(
        "prompt tokens prefill computed (M)",
        vllm.transferred_tokens.to_string(),
        ours.transferred_tokens.to_string(),
    );
    check(
        "tokens to transfer",
        file.tokens_to_transfer.unwrap_or_default().to_string(),
        ours.transferred_tokens
            .saturating_sub(ours.prefix_hit)
            .to_string(),
    );
    check(
        "decode blocks per group",
        format!("{:?}", vllm.decode_blocks),
        format!("{:?}", ours.decode_blocks),
    );
    check(
        "decode transfer blocks per group",
        format!("{:?}", vllm.decode_transfer_blocks),
        format!("{:?}", ours.decode_transfer_blocks),
    );
    check(
        "decode blocks zeroed at allocation per group",
        format!("{:?}", zeroed(vllm)),
        format!("{:?}", zeroed(&ours)),
    );
    check(
        "prefill blocks per group",
        format!("{:?}", vllm.prefill_blocks),
        format!("{:?}", ours.prefill_blocks),
    );
    SchedulerComparison {
        equal: differences.is_empty(),
        differences,
    }
}

/// The placement a recorded scheduler case (a trace's `case` with
/// `requests: "scheduler"`) ran with: each engine's blocks and pool as the
/// trace names them; decode's zeroing at allocation is kvgeom's for those
/// blocks (the place phase held vLLM's to it when the case ran).
pub(crate) fn placed_from_spec(case: &Case, spec: &super::protocol::CaseSpec) -> Placed {
    let geometry = &case.geometry;
    let (prefill, decode) = (&spec.prefill, &spec.decode);
    let groups = geometry.model.groups.len();
    if prefill.request_blocks.len() != groups || decode.request_blocks.len() != groups {
        return Err(Outcome::error(format!(
            "the traced scheduler case holds blocks of {} (prefill) and {} (decode) groups, the \
             geometry has {groups}",
            prefill.request_blocks.len(),
            decode.request_blocks.len()
        )));
    }
    let counts = |b: &[Vec<u32>]| b.iter().map(|g| g.len() as u32).collect::<Vec<u32>>();
    let (prefill_blocks, decode_blocks) = (
        without_null(&prefill.request_blocks),
        without_null(&decode.request_blocks),
    );
    let shape = RequestShape {
        prompt_len: case.prompt_len,
        transferred_tokens: spec.transferred_tokens,
        prefix_hit: case.prefix_hit,
        decode_blocks: counts(&decode_blocks),
        decode_transfer_blocks: counts(&decode.transfer_blocks),
        decode_unzeroed_blocks: counts(&decode.transfer_blocks),
        prefill_blocks: counts(&prefill_blocks),
    };
    Ok((
        shape,
        Placement {
            decode: decode_blocks,
            prefill: prefill_blocks,
            decode_pool: decode.num_logical_blocks,
            prefill_pool: prefill.num_logical_blocks,
        },
    ))
}

/// Copy a placed case's `place.json` and metadata pickle into its run
/// folder, where the run phase reads them.
pub(crate) fn copy_place_files(from: &Path, to: &Path) -> Result<(), BatchError> {
    for name in [PLACE_FILE, META_FILE] {
        let src = from.join(name);
        let dst = to.join(name);
        std::fs::copy(&src, &dst).map_err(|source| BatchError::Write { path: dst, source })?;
    }
    Ok(())
}

/// Write `batch` as `dir/batch.json`, the file the driver reads.
pub(super) fn write_batch_file(dir: &Path, batch: &impl Serialize) -> Result<(), BatchError> {
    let text = serde_json::to_string(batch).map_err(BatchError::Encode)?;
    let batch_file = dir.join("batch.json");
    std::fs::write(&batch_file, text).map_err(|source| BatchError::Write {
        path: batch_file,
        source,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::{read_place, RequestPath, Requests, PLACE_FILE};
    use crate::geometry::{fixtures, Mode};
    use crate::scenario::{Case, Outcome};
    use crate::scheduler::DecodeAllocation;
    use crate::variant::Variant;

    fn case(prompt_len: u32, allocation: DecodeAllocation) -> Case {
        Case {
            geometry: Arc::new(fixtures::g1()),
            file: None,
            prompt_len,
            prefix_hit: 0,
            mode: Mode::Pull,
            allocation,
            seed: 0,
            variant: Variant::KVGEOM,
        }
    }

    /// g1 (MLA + KDA, P 8, D 12), N = 25: M = 24, as vLLM's scheduler
    /// places it in fresh pools (decode's KDA group behind a null block).
    fn placed_json(prefill_attention: &str, decode_transfer: &str) -> String {
        format!(
            r#"{{"format": "kvgeom-vllm-place/1", "id": "c0", "mode": "pull",
            "request_path": "scheduler", "status": "placed", "prompt_len": 25,
            "prefix_hit": 0, "tokens_to_transfer": 24, "seconds": 0.01,
            "prefill": {{"request_blocks": [{prefill_attention}, [9], [10]], "pool_blocks": 3000,
              "needed_blocks": 11, "computed_tokens": 24, "zeroed_at_alloc": [1, 2, 3]}},
            "decode": {{"request_blocks": [[1, 2], [0, 3], [0, 4]], "transfer_blocks": {decode_transfer},
              "computed_blocks": [0, 0, 0], "pool_blocks": 3000, "needed_blocks": 5,
              "local_hit_tokens": 0, "zeroed_at_alloc": []}}}}"#
        )
    }

    fn read(text: Option<&str>, case: &Case) -> super::SchedulerPlaced {
        let dir = std::env::temp_dir().join(format!(
            "kvgeom-place-test-{}-{}",
            std::process::id(),
            text.map_or(0, str::len)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let _ = std::fs::remove_file(dir.join(PLACE_FILE));
        if let Some(text) = text {
            std::fs::write(dir.join(PLACE_FILE), text).unwrap();
        }
        let got = read_place(&dir, case);
        let _ = std::fs::remove_dir_all(&dir);
        got
    }

    #[test]
    fn a_placed_case_takes_the_schedulers_blocks_and_matches_the_model() {
        let c = case(25, DecodeAllocation::Mainline);
        let got = read(Some(&placed_json("[1, 2, 3]", "[[1, 2], [3], [4]]")), &c);
        let (shape, placement) = got.placed.expect("placed");
        assert_eq!(placement.prefill, vec![vec![1, 2, 3], vec![9], vec![10]]);
        // vLLM's null block is a placeholder, not the request's memory.
        assert_eq!(placement.decode, vec![vec![1, 2], vec![3], vec![4]]);
        assert!(placement.prefill_pool >= 11 && placement.decode_pool >= 5);
        assert_eq!(shape.transferred_tokens, 24);
        assert_eq!(shape.decode_unzeroed_blocks, vec![2, 1, 1]);
        let model = got.info.model.expect("compared");
        assert!(model.equal, "{:?}", model.differences);
        assert_eq!(got.info.seconds, Some(0.01));
    }

    #[test]
    fn a_scheduler_that_differs_from_the_model_is_named() {
        let c = case(25, DecodeAllocation::Mainline);
        let got = read(Some(&placed_json("[1, 2, 3, 5]", "[[1, 2], [3], [4]]")), &c);
        assert!(got.placed.is_ok());
        let model = got.info.model.expect("compared");
        assert!(!model.equal);
        assert_eq!(
            model.differences,
            vec!["prefill blocks per group: vLLM [4, 1, 1], kvgeom [3, 1, 1]".to_string()]
        );
    }

    #[test]
    fn unreachable_refused_and_inconsistent_placements_are_outcomes() {
        let c = case(25, DecodeAllocation::Mainline);
        let unreachable = r#"{"format": "kvgeom-vllm-place/1", "status": "not reachable by vLLM's scheduler",
            "reason": "a prefix hit of 8 tokens is not whole decode blocks of 12"}"#;
        match read(Some(unreachable), &c).placed {
            Err(Outcome::NotReachable { reason }) => assert!(reason.contains("8 tokens")),
            other => panic!("{other:?}"),
        }
        let refused = r#"{"format": "kvgeom-vllm-place/1", "status": "error", "message": "boom"}"#;
        match read(Some(refused), &c).placed {
            Err(Outcome::Error { message }) => {
                assert!(message.contains("vLLM's scheduler refused the case: boom"))
            }
            other => panic!("{other:?}"),
        }
        let wrong = placed_json("[1, 2, 3]", "[[2], [3], [4]]");
        match read(Some(&wrong), &c).placed {
            Err(Outcome::Error { message }) => assert!(message.contains("decode loads into")),
            other => panic!("{other:?}"),
        }
        match read(None, &c).placed {
            Err(Outcome::Error { message }) => assert!(message.contains("left no placement")),
            other => panic!("{other:?}"),
        }
        let bad = r#"{"format": "kvgeom-vllm-place/9", "status": "placed"}"#;
        assert!(read(Some(bad), &c).placed.is_err());
    }

    #[test]
    fn with_last_token_cases_are_always_direct() {
        let mainline = case(25, DecodeAllocation::Mainline);
        let last = case(25, DecodeAllocation::WithLastToken);
        assert_eq!(
            Requests::Scheduler.path_of(&mainline),
            RequestPath::Scheduler
        );
        assert_eq!(Requests::Scheduler.path_of(&last), RequestPath::Direct);
        assert_eq!(Requests::Direct.path_of(&mainline), RequestPath::Direct);
    }
}
