//! One SGLang case as a `kvgeom-trace/3` file (docs/trace-format.md,
//! "SGLang's runs"): what ran, the case (geometry, prompt, seed and the
//! driver's case entry: pools, pages, state slots), the driver's
//! `result.json` as it wrote it, and decode's final memory (prefill's
//! where it differs from kvgeom's preparation) when the case's memory is at
//! most [`TRACE_MEMORY_LIMIT`]. Reading one rebuilds kvgeom's preparation
//! of the case and requires the recorded case entry to be exactly it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;
use serde_json::{json, Value};

use super::batch::{self, Prepared};
use super::final_memory::{FinalMemory, ImageKind};
use super::result::{DriverResult, RESULT_FORMAT};
use crate::driver::TRACE_MEMORY_LIMIT;
use crate::geometry::{parse_geometry, to_toml, Geometry, Mode, Stack};
use crate::limits::{read_capped, MAX_INPUT_BYTES, MAX_PROMPT_LEN};
use crate::scenario::Case;
use crate::scheduler::DecodeAllocation;
use crate::trace::base64::{self, EncodedMemory};
use crate::trace::TRACE_FORMAT_V3;
use crate::under_test::{CodeUnderTest, ConnectorKind};
use crate::variant::Variant;

/// The most memory (both engines' KV regions and state tensors) a traced
/// case may ask kvgeom to rebuild.
pub const MAX_TRACED_MEMORY: u64 = 1 << 30;

/// Why an SGLang trace cannot be written or read; names the file.
#[derive(Debug, thiserror::Error)]
#[error("{}: {kind}", path.display())]
pub struct SglangTraceError {
    /// The trace.
    pub path: PathBuf,
    /// What is wrong.
    pub kind: SglangTraceErrorKind,
}

/// What is wrong with an SGLang trace.
#[derive(Debug, thiserror::Error)]
pub enum SglangTraceErrorKind {
    /// The file cannot be read or written.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The file is too large.
    #[error("{0}")]
    Input(#[from] crate::limits::InputError),
    /// The gzip stream is broken.
    #[error("{0}")]
    Decompress(Box<crate::trace::TraceError>),
    /// Not JSON, or a field missing, unknown or of the wrong type.
    #[error("not an SGLang trace: {0}")]
    Shape(serde_json::Error),
    /// Another format, or another connector.
    #[error("format {format:?} of connector {connector:?} is not {TRACE_FORMAT_V3} of sglang")]
    NotSglang {
        /// The `format` found.
        format: String,
        /// `code_under_test.connector`.
        connector: String,
    },
    /// The driver's result has another format.
    #[error("result.format {0:?} is not {RESULT_FORMAT}")]
    ResultFormat(String),
    /// The geometry is not a valid SGLang geometry.
    #[error("the traced geometry: {0}")]
    Geometry(String),
    /// The prompt is out of range.
    #[error("case.prompt_len {0} is not in 1..={MAX_PROMPT_LEN}")]
    PromptLen(u32),
    /// kvgeom cannot prepare the case.
    #[error("kvgeom cannot model the traced case: {0}")]
    Model(#[from] super::error::ModelError),
    /// The case would take too much memory to rebuild.
    #[error(
        "the traced case holds {0} bytes of pools; kvgeom rebuilds at most {MAX_TRACED_MEMORY}"
    )]
    TooLarge(u64),
    /// The recorded case entry is not kvgeom's preparation.
    #[error(
        "case.driver_case.{field} is not what kvgeom prepares for the geometry, prompt and seed: \
         traced {traced}, kvgeom {ours}"
    )]
    CaseMismatch {
        /// The field.
        field: String,
        /// Traced.
        traced: String,
        /// kvgeom's.
        ours: String,
    },
    /// Memory images in another encoding.
    #[error("memory.encoding {0:?} is not base64")]
    Encoding(String),
    /// An image that names no region or tensor of the case, is given
    /// twice, has the wrong length or is not base64.
    #[error("memory.images[{index}] ({agent} {what}): {why}")]
    Image {
        /// Its position.
        index: usize,
        /// Its agent.
        agent: String,
        /// `region N` or `state tensor N`.
        what: String,
        /// What is wrong.
        why: String,
    },
    /// Decode's image of a region or tensor is missing.
    #[error("memory.images has no image of {agent} {what} (every decode image is recorded)")]
    MissingImage {
        /// The agent.
        agent: String,
        /// `region N` or `state tensor N`.
        what: String,
    },
    /// Both memory and the reason it was left out, or neither.
    #[error("a trace has either memory or memory_left_out, not {0}")]
    MemoryChoice(&'static str),
}

impl SglangTraceError {
    fn new(path: &Path, kind: impl Into<SglangTraceErrorKind>) -> Self {
        SglangTraceError {
            path: path.to_path_buf(),
            kind: kind.into(),
        }
    }
}

/// The bytes of every KV region and state tensor of both engines.
pub fn case_memory_bytes(p: &Prepared) -> u64 {
    let kv: u64 = [&p.prefill, &p.decode]
        .iter()
        .flat_map(|e| (0..e.attn_tp).flat_map(|r| e.regions(r)))
        .map(|r| r.len)
        .sum();
    let state: u64 = p.state.as_ref().map_or(0, |(ps, ds)| {
        [ps, ds]
            .iter()
            .flat_map(|s| (0..s.attn_tp).flat_map(|r| s.tensors(r)))
            .map(|t| t.len())
            .sum()
    });
    kv + state
}

/// Prefill's initial image of `kind` `index` on `rank`, as kvgeom prepares it.
fn prefill_initial(p: &Prepared, rank: u32, kind: ImageKind, index: u32) -> Option<Vec<u8>> {
    match kind {
        ImageKind::Region => (index < p.prefill.regions(rank).len() as u32).then(|| {
            super::images::prefill_region(&p.prefill, rank, index, &p.placement.prefill_pages)
        }),
        ImageKind::State => {
            let (ps, _) = p.state.as_ref()?;
            ps.tensors(rank)
                .get(index as usize)
                .map(super::state::prefill_image)
        }
    }
}

/// Every (agent, kind, index, length) of the case's memory, prefill first.
fn every_image(p: &Prepared) -> Vec<(String, u32, ImageKind, u32, u64)> {
    let mut out = Vec::new();
    for (pools, state) in [
        (&p.prefill, p.state.as_ref().map(|s| &s.0)),
        (&p.decode, p.state.as_ref().map(|s| &s.1)),
    ] {
        for rank in 0..pools.attn_tp {
            let agent = format!("{}-{rank}", pools.side);
            for r in pools.regions(rank) {
                out.push((agent.clone(), rank, ImageKind::Region, r.index, r.len));
            }
            if let Some(s) = state {
                for t in s.tensors(rank) {
                    out.push((agent.clone(), rank, ImageKind::State, t.index, t.len()));
                }
            }
        }
    }
    out
}

/// The trace of one case the driver ran, from its folder `case_dir` (the
/// `result.json` and `.out` files): its JSON.
pub fn trace_of(case: &Case, p: &Prepared, case_dir: &Path) -> Result<Value, SglangTraceErrorKind> {
    let result: Value = serde_json::from_slice(&std::fs::read(case_dir.join("result.json"))?)
        .map_err(SglangTraceErrorKind::Shape)?;
    let text = |k: &str| result.get(k).and_then(Value::as_str).unwrap_or("unknown");
    let code = CodeUnderTest::sglang(text("sglang"), text("torch"));
    let driver_case = batch::case_spec(p)?;
    let mut trace = json!({
        "format": TRACE_FORMAT_V3,
        "code_under_test": code,
        "case": {
            "geometry": &*case.geometry,
            "prompt_len": case.prompt_len,
            "seed": case.seed,
            "driver_case": driver_case,
        },
        "result": result,
    });
    let total = case_memory_bytes(p);
    let status = text("status");
    let left_out = if total > TRACE_MEMORY_LIMIT {
        Some(format!(
            "the case's memory is {total} bytes, over the {TRACE_MEMORY_LIMIT}-byte limit"
        ))
    } else if status == "hung" || status == "error" {
        Some(format!("the driver's status is {status}: no final memory"))
    } else {
        None
    };
    if let Some(why) = left_out {
        trace["memory_left_out"] = json!(why);
        return Ok(trace);
    }
    let mut images = Vec::new();
    for (agent, rank, kind, index, _) in every_image(p) {
        let after = std::fs::read(case_dir.join(format!("{agent}.{}{index}.out", kind.letter())))?;
        if agent.starts_with("prefill")
            && prefill_initial(p, rank, kind, index).as_deref() == Some(&after[..])
        {
            continue;
        }
        let key = match kind {
            ImageKind::Region => "region",
            ImageKind::State => "state",
        };
        images.push(json!({"agent": agent, key: index, "after": base64::encode(&after)}));
    }
    trace["memory"] = json!({"encoding": "base64", "images": images});
    Ok(trace)
}

/// Write `trace` at `path`, gzipped when the name ends in `.gz`.
pub fn write(trace: &Value, path: &Path) -> Result<(), SglangTraceError> {
    let text = trace.to_string();
    crate::trace::text_file::write_trace_text(path, &text)
        .map_err(|e| SglangTraceError::new(path, e))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTrace {
    format: String,
    code_under_test: CodeUnderTest,
    case: RawCase,
    result: Value,
    #[serde(default)]
    memory: Option<EncodedMemory<RawImage>>,
    #[serde(default)]
    memory_left_out: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCase {
    geometry: Geometry,
    prompt_len: u32,
    seed: u64,
    driver_case: Value,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawImage {
    agent: String,
    #[serde(default)]
    region: Option<u32>,
    #[serde(default)]
    state: Option<u32>,
    after: String,
}

/// One SGLang trace, read and checked against kvgeom's rebuild of its case.
pub struct SglangTrace {
    /// What ran.
    pub code_under_test: CodeUnderTest,
    /// The case kvgeom rebuilds.
    pub case: Case,
    /// kvgeom's preparation of it (equal to the recorded case entry).
    pub prepared: Prepared,
    /// The driver's result.
    pub result: DriverResult,
    /// Final memory per (agent, kind, index); prefill's missing ones are
    /// kvgeom's preparation. `None` when the trace left memory out.
    pub images: Option<BTreeMap<(String, ImageKind, u32), Vec<u8>>>,
    /// Why the trace holds no memory.
    pub memory_left_out: Option<String>,
}

/// Whether a JSON document is an SGLang trace (v3 naming sglang).
pub fn is_sglang_trace(value: &Value) -> bool {
    value.get("format").and_then(Value::as_str) == Some(TRACE_FORMAT_V3)
        && value
            .get("code_under_test")
            .and_then(|c| c.get("connector"))
            .and_then(Value::as_str)
            == Some(ConnectorKind::Sglang.name())
}

/// A trace file's JSON, decompressed when gzipped.
pub fn read_json(path: &Path) -> Result<Value, SglangTraceError> {
    let err = |k: SglangTraceErrorKind| SglangTraceError::new(path, k);
    let bytes = read_capped(path, MAX_INPUT_BYTES).map_err(|e| err(e.into()))?;
    let text = crate::trace::decompress(path, &bytes)
        .map_err(|e| err(SglangTraceErrorKind::Decompress(Box::new(e))))?;
    serde_json::from_slice(&text).map_err(|e| err(SglangTraceErrorKind::Shape(e)))
}

impl SglangTrace {
    /// Read and check the trace at `path`.
    pub fn read(path: &Path) -> Result<SglangTrace, SglangTraceError> {
        Self::parse(path, read_json(path)?)
    }

    /// Check a trace's JSON; `path` names it in errors.
    pub fn parse(path: &Path, value: Value) -> Result<SglangTrace, SglangTraceError> {
        Self::parse_kind(value).map_err(|k| SglangTraceError::new(path, k))
    }

    fn parse_kind(value: Value) -> Result<SglangTrace, SglangTraceErrorKind> {
        use SglangTraceErrorKind as E;
        if !is_sglang_trace(&value) {
            let s = |v: Option<&Value>| v.and_then(Value::as_str).unwrap_or("").to_string();
            return Err(E::NotSglang {
                format: s(value.get("format")),
                connector: s(value
                    .get("code_under_test")
                    .and_then(|c| c.get("connector"))),
            });
        }
        let raw: RawTrace = serde_json::from_value(value).map_err(E::Shape)?;
        debug_assert_eq!(raw.format, TRACE_FORMAT_V3);
        let result: DriverResult = serde_json::from_value(raw.result.clone()).map_err(E::Shape)?;
        if result.format != RESULT_FORMAT {
            return Err(E::ResultFormat(result.format));
        }
        let case = rebuild_case(&raw.case)?;
        let prepared = batch::prepare(&case, 0)?;
        let total = case_memory_bytes(&prepared);
        if total > MAX_TRACED_MEMORY {
            return Err(E::TooLarge(total));
        }
        same_case(&raw.case.driver_case, &batch::case_spec(&prepared)?)?;
        let images = match (raw.memory, &raw.memory_left_out) {
            (Some(_), Some(_)) => return Err(E::MemoryChoice("both")),
            (None, None) => return Err(E::MemoryChoice("neither")),
            (None, Some(_)) => None,
            (Some(m), None) => Some(images(m, &prepared)?),
        };
        Ok(SglangTrace {
            code_under_test: raw.code_under_test,
            case,
            prepared,
            result,
            images,
            memory_left_out: raw.memory_left_out,
        })
    }
}

fn rebuild_case(raw: &RawCase) -> Result<Case, SglangTraceErrorKind> {
    use SglangTraceErrorKind as E;
    let mut geometry =
        parse_geometry("trace", &to_toml(&raw.geometry)).map_err(|e| E::Geometry(e.to_string()))?;
    geometry.name = raw.geometry.name.clone();
    if geometry != raw.geometry {
        return Err(E::Geometry(
            "it does not read back as itself from the file format".into(),
        ));
    }
    if geometry.stack != Stack::Sglang {
        return Err(E::Geometry(
            "not an SGLang geometry (stack = \"sglang\")".into(),
        ));
    }
    if raw.prompt_len == 0 || raw.prompt_len > MAX_PROMPT_LEN {
        return Err(E::PromptLen(raw.prompt_len));
    }
    Ok(Case {
        geometry: Arc::new(geometry),
        file: None,
        prompt_len: raw.prompt_len,
        prefix_hit: 0,
        mode: Mode::Push,
        allocation: DecodeAllocation::Mainline,
        seed: raw.seed,
        variant: Variant::KVGEOM,
    })
}

/// The recorded case entry must be kvgeom's, but for its `id` (the case's
/// position in the batch that ran it).
fn same_case(traced: &Value, ours: &Value) -> Result<(), SglangTraceErrorKind> {
    let (Some(t), Some(o)) = (traced.as_object(), ours.as_object()) else {
        return Err(SglangTraceErrorKind::CaseMismatch {
            field: "(the entry)".into(),
            traced: traced.to_string(),
            ours: ours.to_string(),
        });
    };
    let keys: std::collections::BTreeSet<&String> = t.keys().chain(o.keys()).collect();
    for k in keys.into_iter().filter(|k| *k != "id") {
        let (a, b) = (t.get(k), o.get(k));
        if a != b {
            let show = |v: Option<&Value>| v.map_or("nothing".into(), Value::to_string);
            return Err(SglangTraceErrorKind::CaseMismatch {
                field: k.clone(),
                traced: show(a),
                ours: show(b),
            });
        }
    }
    Ok(())
}

type ImageMap = BTreeMap<(String, ImageKind, u32), Vec<u8>>;

fn images(m: EncodedMemory<RawImage>, p: &Prepared) -> Result<ImageMap, SglangTraceErrorKind> {
    use SglangTraceErrorKind as E;
    let images = m.base64_images().map_err(|e| E::Encoding(e.0))?;
    let lens: BTreeMap<(String, ImageKind, u32), u64> = every_image(p)
        .into_iter()
        .map(|(agent, _, kind, index, len)| ((agent, kind, index), len))
        .collect();
    let mut out = BTreeMap::new();
    for (i, img) in images.into_iter().enumerate() {
        let (kind, index) = match (img.region, img.state) {
            (Some(r), None) => (ImageKind::Region, r),
            (None, Some(s)) => (ImageKind::State, s),
            _ => {
                return Err(E::Image {
                    index: i,
                    agent: img.agent,
                    what: "?".into(),
                    why: "names neither or both of region and state".into(),
                })
            }
        };
        let what = format!("{} {index}", kind.what());
        let bad = |why: String| E::Image {
            index: i,
            agent: img.agent.clone(),
            what: what.clone(),
            why,
        };
        let key = (img.agent.clone(), kind, index);
        let Some(&len) = lens.get(&key) else {
            return Err(bad("no such memory in kvgeom's model of the case".into()));
        };
        let bytes = base64::decode(&img.after).map_err(|e| bad(e.to_string()))?;
        if bytes.len() as u64 != len {
            return Err(bad(format!("{} bytes, the model's has {len}", bytes.len())));
        }
        if out.insert(key, bytes).is_some() {
            return Err(bad("given twice".into()));
        }
    }
    if let Some((agent, kind, index)) = lens
        .keys()
        .find(|k| k.0.starts_with("decode") && !out.contains_key(*k))
    {
        return Err(E::MissingImage {
            agent: agent.clone(),
            what: format!("{} {index}", kind.what()),
        });
    }
    Ok(out)
}

impl FinalMemory for SglangTrace {
    fn image(
        &self,
        agent: &str,
        kind: ImageKind,
        index: u32,
        len: u64,
    ) -> Result<Vec<u8>, super::error::JudgeError> {
        let missing = || super::error::JudgeError::NoImage {
            agent: agent.to_string(),
            what: format!("{} {index}", kind.what()),
        };
        let images = self.images.as_ref().ok_or_else(missing)?;
        if let Some(bytes) = images.get(&(agent.to_string(), kind, index)) {
            return Ok(bytes.clone());
        }
        // Prefill's images left out are those equal to its preparation.
        let rank = agent
            .strip_prefix("prefill-")
            .and_then(|r| r.parse::<u32>().ok())
            .ok_or_else(missing)?;
        prefill_initial(&self.prepared, rank, kind, index)
            .filter(|b| b.len() as u64 == len)
            .ok_or_else(missing)
    }

    fn has_images(&self) -> bool {
        self.images.is_some()
    }
}
