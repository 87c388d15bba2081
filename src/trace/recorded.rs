//! v2 traces (`kvgeom-vllm-trace/2`, docs/trace-format.md): one case the live
//! driver ran on vLLM's real connector, read back into the case kvgeom
//! rebuilds. The trace's case must be exactly what kvgeom prepares for its
//! geometry, prompt, prefix hit, allocation and seed (same pools, same
//! request blocks, same initial memory when the trace holds it), so that
//! vLLM's rows can be judged by kvgeom's layout model of that case.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;

use super::base64;
use super::reader::decompress;
use crate::geometry::{parse_geometry, to_toml, Mode};
use crate::layout::Side;
use crate::limits::{read_capped, MAX_INPUT_BYTES, MAX_PROMPT_LEN};
use crate::live::protocol::{CaseResult, CaseSpec, RESULT_FORMAT};
use crate::live::run::{prepare, side_index, Prepared};
use crate::scenario::{estimate_memory, Case};
use crate::variant::Variant;

/// The `format` of a v2 trace.
pub const TRACE_FORMAT_V2: &str = "kvgeom-vllm-trace/2";

/// The most memory kvgeom allocates to rebuild a traced case.
pub const MAX_REBUILD_BYTES: u64 = 4 << 30;

/// Why a v2 trace cannot be used; names the file.
#[derive(Debug, thiserror::Error)]
#[error("{}: {message}", path.display())]
pub struct RecordedError {
    /// The trace.
    pub path: PathBuf,
    /// What is wrong with it.
    pub message: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTrace {
    format: String,
    vllm_version: String,
    case: CaseSpec,
    result: CaseResult,
    #[serde(default)]
    memory: Option<RawMemory>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMemory {
    encoding: String,
    images: Vec<RawImage>,
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
    /// The vLLM that ran the case.
    pub vllm_version: String,
    /// The case as the driver ran it.
    pub spec: CaseSpec,
    /// What the driver reported.
    pub result: CaseResult,
    /// The case kvgeom rebuilds (variant: vLLM 0.33.0's policy).
    pub case: Case,
    /// Memory images per (agent, region), when the trace holds them.
    pub memory: Option<BTreeMap<(String, u32), RegionImages>>,
}

impl RecordedCase {
    /// Read, parse and check a v2 trace (plain or gzip).
    pub fn read(path: &Path) -> Result<RecordedCase, RecordedError> {
        let err = |message: String| RecordedError {
            path: path.to_path_buf(),
            message,
        };
        let bytes = read_capped(path, MAX_INPUT_BYTES).map_err(|e| err(e.to_string()))?;
        let text = decompress(path, &bytes).map_err(|e| err(e.to_string()))?;
        Self::parse(path, &text)
    }

    /// Parse and check a v2 trace held in memory (decompressed). `path`
    /// only names it in errors.
    pub fn parse(path: &Path, text: &[u8]) -> Result<RecordedCase, RecordedError> {
        let err = |message: String| RecordedError {
            path: path.to_path_buf(),
            message,
        };
        let value: serde_json::Value =
            serde_json::from_slice(text).map_err(|e| err(format!("not JSON: {e}")))?;
        let format = value.get("format").and_then(|f| f.as_str()).unwrap_or("");
        if format != TRACE_FORMAT_V2 {
            return Err(err(format!(
                "format {format:?} is not {TRACE_FORMAT_V2} (a v1 trace is a .jsonl file)"
            )));
        }
        let raw: RawTrace =
            serde_json::from_value(value).map_err(|e| err(format!("not a v2 trace: {e}")))?;
        debug_assert_eq!(raw.format, TRACE_FORMAT_V2);
        if raw.result.format != RESULT_FORMAT {
            return Err(err(format!(
                "result format {:?} is not {RESULT_FORMAT}",
                raw.result.format
            )));
        }
        let case = rebuild_case(&raw.case).map_err(err)?;
        let prepared = prepare_checked(&case, &raw.case).map_err(err)?;
        let memory = match raw.memory {
            None => None,
            Some(m) => Some(memory_images(m, &raw.case, &prepared).map_err(err)?),
        };
        Ok(RecordedCase {
            path: path.to_path_buf(),
            vllm_version: raw.vllm_version,
            spec: raw.case,
            result: raw.result,
            case,
            memory,
        })
    }

    /// kvgeom's preparation of the case: its layout model, arenas and
    /// initial memory (checked equal to the trace's when it was read).
    pub(crate) fn prepared(&self) -> Prepared {
        // `read` has prepared this very case once; it cannot fail now.
        match prepare(&self.case, &self.spec.id) {
            Ok(p) => p,
            Err(o) => unreachable!("a read trace's case prepares: {}", o.describe()),
        }
    }
}

/// The case of a trace, its geometry validated as a geometry file's is.
fn rebuild_case(spec: &CaseSpec) -> Result<Case, String> {
    let mut geometry = parse_geometry("trace", &to_toml(&spec.geometry))
        .map_err(|e| format!("the traced geometry is not valid: {e}"))?;
    geometry.name = spec.geometry.name.clone();
    if geometry != spec.geometry {
        return Err("the traced geometry does not read back as itself from the file format".into());
    }
    let mode = match spec.mode.as_str() {
        "pull" => Mode::Pull,
        "push" => Mode::Push,
        other => return Err(format!("mode {other:?} is neither pull nor push")),
    };
    if spec.prompt_len == 0 || spec.prompt_len > MAX_PROMPT_LEN {
        return Err(format!(
            "prompt_len {} is not in 1..={MAX_PROMPT_LEN}",
            spec.prompt_len
        ));
    }
    let case = Case {
        geometry: Arc::new(geometry),
        file: None,
        prompt_len: spec.prompt_len,
        prefix_hit: spec.prefix_hit,
        mode,
        allocation: spec.allocation,
        seed: spec.seed,
        variant: Variant::Policy(crate::connector::NamedPolicy::Vllm0330),
    };
    let need = estimate_memory(&case).peak_bytes;
    if need > MAX_REBUILD_BYTES {
        return Err(format!(
            "rebuilding the case needs {need} bytes, above the limit of {MAX_REBUILD_BYTES}"
        ));
    }
    Ok(case)
}

/// kvgeom's preparation of `case`, which must give the trace's spec.
fn prepare_checked(case: &Case, spec: &CaseSpec) -> Result<Prepared, String> {
    let p = prepare(case, &spec.id)
        .map_err(|o| format!("kvgeom cannot prepare the traced case: {}", o.describe()))?;
    let ours = &p.spec;
    let fields: [(&str, bool); 4] = [
        (
            "transferred_tokens",
            ours.transferred_tokens == spec.transferred_tokens,
        ),
        ("prefix_hit", ours.prefix_hit == spec.prefix_hit),
        ("prefill", ours.prefill == spec.prefill),
        ("decode", ours.decode == spec.decode),
    ];
    if let Some((field, _)) = fields.iter().find(|(_, same)| !same) {
        let show = |s: &CaseSpec| match *field {
            "prefill" => format!("{:?}", s.prefill),
            "decode" => format!("{:?}", s.decode),
            "prefix_hit" => s.prefix_hit.to_string(),
            _ => s.transferred_tokens.to_string(),
        };
        return Err(format!(
            "the trace's case.{field} is not what kvgeom prepares for its geometry, prompt, \
             prefix hit, allocation and seed: traced {}, kvgeom {}",
            show(spec),
            show(ours)
        ));
    }
    Ok(p)
}

/// The trace's images, one for every region of every rank of both engines,
/// each as long as the region, the initial ones equal to kvgeom's.
fn memory_images(
    m: RawMemory,
    spec: &CaseSpec,
    p: &Prepared,
) -> Result<BTreeMap<(String, u32), RegionImages>, String> {
    if m.encoding != "base64" {
        return Err(format!("memory encoding {:?} is not base64", m.encoding));
    }
    let mut out = BTreeMap::new();
    for image in m.images {
        let Some((side, rank)) = Side::parse_agent_name(&image.agent) else {
            return Err(format!("memory image of unknown agent {:?}", image.agent));
        };
        let decode = |which: &str, text: &str| {
            base64::decode(text).map_err(|e| {
                format!(
                    "memory image {} r{} {which}: {e}",
                    image.agent, image.region
                )
            })
        };
        let images = RegionImages {
            before: decode("before", &image.before)?,
            after: decode("after", &image.after)?,
        };
        let Some(ours) = p.before[side_index(side)]
            .get(rank as usize)
            .and_then(|r| r.get(image.region as usize))
        else {
            return Err(format!(
                "memory image of {} r{}: the case has no such region",
                image.agent, image.region
            ));
        };
        if images.after.len() != ours.len() {
            return Err(format!(
                "memory image {} r{} after: {} bytes, the region holds {}",
                image.agent,
                image.region,
                images.after.len(),
                ours.len()
            ));
        }
        if images.before != *ours {
            return Err(format!(
                "memory image {} r{} before is not the memory kvgeom prepares for this case",
                image.agent, image.region
            ));
        }
        if out
            .insert((image.agent.clone(), image.region), images)
            .is_some()
        {
            return Err(format!(
                "memory image {} r{} given twice",
                image.agent, image.region
            ));
        }
    }
    let expected: usize = [&spec.prefill, &spec.decode]
        .iter()
        .map(|s| (s.tp_size * s.regions) as usize)
        .sum();
    if out.len() != expected {
        return Err(format!(
            "memory images of {} regions, the case has {expected}",
            out.len()
        ));
    }
    Ok(out)
}
