//! v2 traces (`kvgeom-vllm-trace/2`, docs/trace-format.md): one case the live
//! driver ran on vLLM's real connector, read back into the case kvgeom
//! rebuilds; v3 traces (`kvgeom-trace/3`) are the same run record naming
//! the code that ran (kvgeom's connector records them). The trace's case must be exactly what kvgeom prepares for its
//! geometry, prompt, prefix hit, allocation and seed (same pools, same
//! request blocks, same initial memory when the trace holds it), so that
//! vLLM's rows can be judged by kvgeom's layout model of that case.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;

use crate::geometry::{parse_geometry, to_toml, GeometryError, Mode};
use crate::layout::Side;
use crate::limits::{read_capped, InputError, MAX_INPUT_BYTES, MAX_PROMPT_LEN};
use crate::live::protocol::{CaseResult, CaseSpec, RESULT_FORMAT};
use crate::live::run::{prepare, side_index, Prepared};
use crate::scenario::memory_estimate::process_budget;
use crate::scenario::{estimate_memory, Case};
use crate::trace::base64::{self, EncodedMemory};
use crate::trace::TRACE_FORMAT_V3;
use crate::trace::{decompress, TraceError};
use crate::under_test::{CodeUnderTest, ConnectorKind, RELEASES};
use crate::variant::Variant;

/// The `format` of a v2 trace.
pub const TRACE_FORMAT_V2: &str = "kvgeom-vllm-trace/2";

/// The most memory kvgeom allocates to rebuild a traced case.
pub const MAX_REBUILD_BYTES: u64 = 4 << 30;

/// Why a v2 trace cannot be used; names the file.
#[derive(Debug, thiserror::Error)]
#[error("{}: {kind}", path.display())]
pub struct RecordedError {
    /// The trace.
    pub path: PathBuf,
    /// What is wrong with it.
    pub kind: RecordedErrorKind,
}

impl RecordedError {
    pub(crate) fn new(path: &Path, kind: RecordedErrorKind) -> Self {
        RecordedError {
            path: path.to_path_buf(),
            kind,
        }
    }
}

/// What is wrong with a v2 trace.
#[derive(Debug, thiserror::Error)]
pub enum RecordedErrorKind {
    /// The file cannot be read, or is too large.
    #[error("{0}")]
    Input(#[from] InputError),
    /// The gzip stream is broken or inflates too large.
    #[error("{0}")]
    Decompress(Box<TraceError>),
    /// Not one JSON value.
    #[error("not JSON: {0}")]
    Json(serde_json::Error),
    /// Another format.
    #[error(
        "format {found:?} is not {TRACE_FORMAT_V2} or {TRACE_FORMAT_V3} \
         (a v1 trace is a .jsonl file)"
    )]
    Format {
        /// The `format` found (empty when none).
        found: String,
    },
    /// A v3 trace of SGLang's connector: its pools are not kvgeom's block
    /// layout, which every trace check models.
    #[error(
        "an SGLang trace (code_under_test.connector = \"sglang\"): a replay judges kvgeom's \
         block layout, and SGLang's pools (per-head slices of K and V pages) are not modelled \
         by it; `kvgeom check-trace` judges SGLang's traces (docs/trace-format.md)"
    )]
    Sglang,
    /// A field is missing, unknown or of the wrong type.
    #[error("not a v2 trace: {0}")]
    Shape(serde_json::Error),
    /// The driver's result has another format.
    #[error("result format {found:?} is not {RESULT_FORMAT}")]
    ResultFormat {
        /// The result's `format`.
        found: String,
    },
    /// The geometry breaks a rule of the geometry files.
    #[error("the traced geometry is not valid: {0}")]
    Geometry(Box<GeometryError>),
    /// The geometry does not survive writing and reading back.
    #[error("the traced geometry does not read back as itself from the file format")]
    GeometryRoundTrip,
    /// The mode is not a mode.
    #[error("mode {0:?} is neither pull nor push")]
    Mode(String),
    /// The prompt length is out of range.
    #[error("prompt_len {0} is not in 1..={MAX_PROMPT_LEN}")]
    PromptLen(u32),
    /// Rebuilding the case would take too much memory.
    #[error("rebuilding the case: {refusal}")]
    TooLarge {
        /// Bytes kvgeom's rebuild of the case would allocate.
        need: u64,
        /// The case, its estimate and the budget (`--max-memory`, at most
        /// [`MAX_REBUILD_BYTES`]).
        refusal: String,
    },
    /// kvgeom's scenario cannot prepare the case.
    #[error("kvgeom cannot prepare the traced case: {0}")]
    Prepare(String),
    /// The traced case is not kvgeom's preparation of its parameters.
    #[error(
        "the trace's case.{field} is not what kvgeom prepares for its geometry, prompt, \
         prefix hit, allocation and seed: traced {traced}, kvgeom {ours}"
    )]
    CaseMismatch {
        /// The field that differs.
        field: &'static str,
        /// Its traced value.
        traced: String,
        /// kvgeom's.
        ours: String,
    },
    /// A row whose end lies past the top of the address space (NIXL
    /// refuses such a list).
    #[error("list {handle} of {agent}: row {row} ends past the address space")]
    RowOverflows {
        /// The agent that prepared the list.
        agent: String,
        /// The list's handle.
        handle: u64,
        /// The row's index.
        row: usize,
    },
    /// A region whose end lies past the top of the address space.
    #[error("region {region} of {agent} ends past the address space")]
    RegionOverflows {
        /// The agent whose region it is.
        agent: String,
        /// The region's index.
        region: usize,
    },
    /// Memory images in an unknown encoding.
    #[error("memory encoding {0:?} is not base64")]
    Encoding(String),
    /// One memory image is unusable.
    #[error("memory image {agent} r{region}: {problem}")]
    Image {
        /// The agent of the image.
        agent: String,
        /// Its region.
        region: u32,
        /// What is wrong with it.
        problem: ImageProblem,
    },
    /// Images missing for some regions.
    #[error("memory images of {found} regions, the case has {expected}")]
    ImageCount {
        /// Regions with images.
        found: usize,
        /// Regions of the case.
        expected: usize,
    },
    /// The driver reported that it could not run the case.
    #[error("the driver could not run the traced case: {0}")]
    DriverError(String),
    /// A status the driver never writes.
    #[error("unknown status {0:?}")]
    Status(String),
    /// vLLM's transfers name an unknown list or operation.
    #[error("{0}")]
    Resolve(String),
    /// kvgeom's connector cannot run the case.
    #[error("kvgeom cannot run the traced case: {0}")]
    Rebuild(String),
}

/// What is wrong with one memory image.
#[derive(Debug, thiserror::Error)]
pub enum ImageProblem {
    /// Its agent is neither `prefill-<rank>` nor `decode-<rank>`.
    #[error("unknown agent")]
    UnknownAgent,
    /// The case has no such rank or region.
    #[error("the case has no such region")]
    NoSuchRegion,
    /// An image does not decode.
    #[error("{which}: {source}")]
    NotBase64 {
        /// `before` or `after`.
        which: &'static str,
        /// Why.
        #[source]
        source: base64::Base64Error,
    },
    /// The final image's length is not the region's.
    #[error("after: {found} bytes, the region holds {expected}")]
    Length {
        /// Bytes found.
        found: usize,
        /// The region's bytes.
        expected: usize,
    },
    /// The initial image is not kvgeom's initial memory.
    #[error("before is not the memory kvgeom prepares for this case")]
    NotPrepared,
    /// Two images of one region.
    #[error("given twice")]
    Twice,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTrace {
    format: String,
    vllm_version: String,
    case: CaseSpec,
    result: CaseResult,
    #[serde(default)]
    memory: Option<EncodedMemory<RawImage>>,
}

/// A v3 trace: a v2 trace whose `vllm_version` is replaced by what ran.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTraceV3 {
    format: String,
    code_under_test: CodeUnderTest,
    case: CaseSpec,
    result: CaseResult,
    #[serde(default)]
    memory: Option<EncodedMemory<RawImage>>,
}

impl RawTraceV3 {
    /// As a v2 trace, with the vLLM release whose known defects explain a
    /// difference: the traced vLLM's, or the release kvgeom's connector
    /// was run as (`--policy`), else none.
    fn into_v2(self) -> (RawTrace, CodeUnderTest) {
        let code = self.code_under_test;
        let vllm_version = match code.connector {
            ConnectorKind::Vllm => code.version.clone(),
            _ => RELEASES
                .iter()
                .find(|r| code.policy.as_deref() == Some(r.policy.name()))
                .map_or_else(String::new, |r| r.version.to_string()),
        };
        let raw = RawTrace {
            format: self.format,
            vllm_version,
            case: self.case,
            result: self.result,
            memory: self.memory,
        };
        (raw, code)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawImage {
    agent: String,
    region: u32,
    before: String,
    after: String,
}

/// One region's bytes before and after the case.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegionImages {
    /// Before the handshake (kvgeom's initial memory).
    pub before: Vec<u8>,
    /// After the transfers and the receive post-process.
    pub after: Vec<u8>,
}

/// A v2 trace, checked against kvgeom's rebuild of its case.
pub struct RecordedCase {
    /// The file read.
    pub path: PathBuf,
    /// The vLLM that ran the case (v2), or the release whose known defects
    /// explain a difference (v3: the traced vLLM, or the release kvgeom's
    /// connector was run as; empty when none).
    pub vllm_version: String,
    /// What ran: a v2 trace's vLLM, or a v3 trace's `code_under_test`.
    pub code_under_test: CodeUnderTest,
    /// The case as the driver ran it.
    pub spec: CaseSpec,
    /// What the driver reported.
    pub result: CaseResult,
    /// The case kvgeom rebuilds. Its variant is kvgeom's: the preparation
    /// does not depend on it, and each judge picks the policy (diff-trace its
    /// `--policy`; the explanation the defects of [`Self::vllm_version`]).
    pub case: Case,
    /// Memory images per (agent, region), when the trace holds them.
    pub memory: Option<BTreeMap<(String, u32), RegionImages>>,
    /// kvgeom's preparation of the case.
    pub(crate) prepared: Prepared,
}

impl RecordedCase {
    /// Read, parse and check a v2 trace (plain or gzip).
    pub fn read(path: &Path) -> Result<RecordedCase, RecordedError> {
        let err = |kind| RecordedError::new(path, kind);
        let bytes = read_capped(path, MAX_INPUT_BYTES).map_err(|e| err(e.into()))?;
        let text = decompress(path, &bytes)
            .map_err(|e| err(RecordedErrorKind::Decompress(Box::new(e))))?;
        Self::parse(path, &text)
    }

    /// Parse and check a v2 trace held in memory (decompressed). `path`
    /// only names it in errors.
    pub fn parse(path: &Path, text: &[u8]) -> Result<RecordedCase, RecordedError> {
        let err = |kind| RecordedError::new(path, kind);
        let value: serde_json::Value =
            serde_json::from_slice(text).map_err(|e| err(RecordedErrorKind::Json(e)))?;
        let format = value.get("format").and_then(|f| f.as_str()).unwrap_or("");
        let shape = |e| err(RecordedErrorKind::Shape(e));
        let (raw, code_under_test) = match format {
            TRACE_FORMAT_V2 => {
                let raw: RawTrace = serde_json::from_value(value).map_err(shape)?;
                let code = CodeUnderTest::vllm(&raw.vllm_version);
                (raw, code)
            }
            TRACE_FORMAT_V3 => {
                let raw: RawTraceV3 = serde_json::from_value(value).map_err(shape)?;
                if raw.code_under_test.connector == ConnectorKind::Sglang {
                    return Err(err(RecordedErrorKind::Sglang));
                }
                raw.into_v2()
            }
            _ => {
                return Err(err(RecordedErrorKind::Format {
                    found: format.to_string(),
                }))
            }
        };
        debug_assert!([TRACE_FORMAT_V2, TRACE_FORMAT_V3].contains(&raw.format.as_str()));
        if raw.result.format != RESULT_FORMAT {
            return Err(err(RecordedErrorKind::ResultFormat {
                found: raw.result.format.clone(),
            }));
        }
        check_rows(&raw.result).map_err(err)?;
        let case = rebuild_case(&raw.case).map_err(err)?;
        let prepared = prepare_checked(&case, &raw.case).map_err(err)?;
        let memory = match raw.memory {
            None => None,
            Some(m) => Some(memory_images(m, &raw.case, &prepared).map_err(err)?),
        };
        Ok(RecordedCase {
            path: path.to_path_buf(),
            vllm_version: raw.vllm_version,
            code_under_test,
            spec: raw.case,
            result: raw.result,
            case,
            memory,
            prepared,
        })
    }

    /// kvgeom's preparation of the case: its layout model, arenas and
    /// initial memory (checked equal to the trace's when it was read).
    pub(crate) fn prepared(&self) -> &Prepared {
        &self.prepared
    }
}

/// Every region and every row of every list ends inside the address space.
fn check_rows(result: &CaseResult) -> Result<(), RecordedErrorKind> {
    for (agent, regions) in &result.regions {
        if let Some(region) = regions
            .iter()
            .position(|&(base, len)| base.checked_add(len).is_none())
        {
            return Err(RecordedErrorKind::RegionOverflows {
                agent: agent.clone(),
                region,
            });
        }
    }
    for d in &result.dlists {
        if let Some(row) = d
            .rows
            .iter()
            .position(|&(addr, len, _)| addr.checked_add(len).is_none())
        {
            return Err(RecordedErrorKind::RowOverflows {
                agent: d.agent.clone(),
                handle: d.handle,
                row,
            });
        }
    }
    Ok(())
}

/// The case of a trace, its geometry validated as a geometry file's is.
fn rebuild_case(spec: &CaseSpec) -> Result<Case, RecordedErrorKind> {
    let mut geometry = parse_geometry("trace", &to_toml(&spec.geometry))
        .map_err(|e| RecordedErrorKind::Geometry(Box::new(e)))?;
    geometry.name = spec.geometry.name.clone();
    if geometry != spec.geometry {
        return Err(RecordedErrorKind::GeometryRoundTrip);
    }
    let mode = match spec.mode.as_str() {
        "pull" => Mode::Pull,
        "push" => Mode::Push,
        other => return Err(RecordedErrorKind::Mode(other.to_string())),
    };
    if spec.prompt_len == 0 || spec.prompt_len > MAX_PROMPT_LEN {
        return Err(RecordedErrorKind::PromptLen(spec.prompt_len));
    }
    let case = Case {
        geometry: Arc::new(geometry),
        file: None,
        prompt_len: spec.prompt_len,
        prefix_hit: spec.prefix_hit,
        mode,
        allocation: spec.allocation,
        seed: spec.seed,
        variant: Variant::KVGEOM,
    };
    // The preparation holds every rank's arenas and a copy of their images,
    // and the judging runs the case again.
    let estimate = estimate_memory(&case);
    let need = estimate.prepared_bytes();
    let budget = process_budget().capped(MAX_REBUILD_BYTES, "the limit on rebuilding a trace,");
    if need > budget.bytes {
        let extra = need - estimate.every_rank_bytes;
        let purpose = "for the copies of their initial images and the judging run";
        return Err(RecordedErrorKind::TooLarge {
            need,
            refusal: estimate.refusal_of(&case, true, Some((extra, purpose)), &budget),
        });
    }
    Ok(case)
}

/// kvgeom's preparation of `case`, which must give the trace's spec.
fn prepare_checked(case: &Case, spec: &CaseSpec) -> Result<Prepared, RecordedErrorKind> {
    // A case vLLM's scheduler placed is prepared for the blocks it chose.
    let p = match spec.requests {
        crate::live::RequestPath::Scheduler => crate::live::run::prepare_placed(
            case,
            crate::live::place::placed_from_spec(case, spec),
            &spec.id,
        )
        .map(|mut p| {
            // The trace lists vLLM's blocks as the scheduler did (null
            // placeholders included).
            p.spec.requests = spec.requests;
            p.spec.prefill.request_blocks = spec.prefill.request_blocks.clone();
            p.spec.decode.request_blocks = spec.decode.request_blocks.clone();
            p
        }),
        crate::live::RequestPath::Direct => prepare(case, &spec.id),
    }
    .map_err(|o| RecordedErrorKind::Prepare(o.describe()))?;
    let ours = &p.spec;
    let mismatch = |field, traced: String, ours: String| {
        Err(RecordedErrorKind::CaseMismatch {
            field,
            traced,
            ours,
        })
    };
    if ours.transferred_tokens != spec.transferred_tokens {
        return mismatch(
            "transferred_tokens",
            spec.transferred_tokens.to_string(),
            ours.transferred_tokens.to_string(),
        );
    }
    if ours.prefill != spec.prefill {
        return mismatch(
            "prefill",
            format!("{:?}", spec.prefill),
            format!("{:?}", ours.prefill),
        );
    }
    if ours.decode != spec.decode {
        return mismatch(
            "decode",
            format!("{:?}", spec.decode),
            format!("{:?}", ours.decode),
        );
    }
    Ok(p)
}

/// The trace's images, one for every region of every rank of both engines,
/// each as long as the region, the initial ones equal to kvgeom's.
fn memory_images(
    m: EncodedMemory<RawImage>,
    spec: &CaseSpec,
    p: &Prepared,
) -> Result<BTreeMap<(String, u32), RegionImages>, RecordedErrorKind> {
    let images = m
        .base64_images()
        .map_err(|e| RecordedErrorKind::Encoding(e.0))?;
    let mut out = BTreeMap::new();
    for image in images {
        let fail = |problem| RecordedErrorKind::Image {
            agent: image.agent.clone(),
            region: image.region,
            problem,
        };
        let Some((side, rank)) = Side::parse_agent_name(&image.agent) else {
            return Err(fail(ImageProblem::UnknownAgent));
        };
        let decode = |which, text: &str| {
            base64::decode(text).map_err(|source| fail(ImageProblem::NotBase64 { which, source }))
        };
        let images = RegionImages {
            before: decode("before", &image.before)?,
            after: decode("after", &image.after)?,
        };
        let Some(ours) = p.before[side_index(side)]
            .get(rank as usize)
            .and_then(|r| r.get(image.region as usize))
        else {
            return Err(fail(ImageProblem::NoSuchRegion));
        };
        if images.after.len() != ours.len() {
            return Err(fail(ImageProblem::Length {
                found: images.after.len(),
                expected: ours.len(),
            }));
        }
        if images.before != *ours {
            return Err(fail(ImageProblem::NotPrepared));
        }
        if out
            .insert((image.agent.clone(), image.region), images)
            .is_some()
        {
            return Err(fail(ImageProblem::Twice));
        }
    }
    let expected: usize = [&spec.prefill, &spec.decode]
        .iter()
        .map(|s| (s.tp_size * s.regions) as usize)
        .sum();
    if out.len() != expected {
        return Err(RecordedErrorKind::ImageCount {
            found: out.len(),
            expected,
        });
    }
    Ok(out)
}
