//! The files kvgeom and the vLLM driver exchange (vllm-driver/README.md).
//!
//! kvgeom writes `batch.json` and each case's initial memory; the driver
//! writes each case's `result.json` and final memory.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::geometry::Geometry;
use crate::scenario::HandshakeRecord;
use crate::scheduler::DecodeAllocation;

/// The `format` of `batch.json`.
pub const BATCH_FORMAT: &str = "kvgeom-vllm-batch/1";
/// The `format` of each `result.json`.
pub const RESULT_FORMAT: &str = "kvgeom-vllm-result/1";

/// One batch: every case the driver runs in one process.
#[derive(Clone, Debug, Serialize)]
pub struct Batch {
    /// `BATCH_FORMAT`.
    pub format: &'static str,
    /// The driver gives up on a case after this long and reports it `hung`.
    pub case_timeout_s: f64,
    /// The cases, run one after another in one process.
    pub cases: Vec<CaseSpec>,
    /// Deployments whose blocks the driver derives with vLLM's own
    /// functions before the cases (`blocks.json`). Omitted when empty.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub block_checks: Vec<super::blocks::BlockCheckSpec>,
    /// What moves the bytes: `stand-in` (the driver's NIXL stand-in) or
    /// `real` (real NIXL agents over host memory).
    pub nixl: &'static str,
    /// Set when traces are recorded: the driver writes each case's
    /// `trace.json` (docs/trace-format.md), with the memory images of a case
    /// whose initial memory holds at most this many bytes. Omitted otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace_memory_limit: Option<u64>,
}

/// One case as the driver sees it (and as a v2 trace records it).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CaseSpec {
    /// The case's name in messages (geometry, prompt, hit, mode, allocation).
    pub id: String,
    /// Folder of the case's memory files and result, relative to the batch
    /// folder (a trace leaves it out).
    #[serde(default)]
    pub dir: String,
    /// `pull` or `push`.
    pub mode: String,
    /// N, the prompt length in tokens.
    pub prompt_len: u32,
    /// Tokens decode already holds in its prefix cache.
    pub prefix_hit: u32,
    /// Tokens whose KV moves (M).
    pub transferred_tokens: u32,
    /// How many blocks decode holds for the request.
    pub allocation: DecodeAllocation,
    /// Seed of the block placement among neighbour requests.
    pub seed: u64,
    /// The P/D geometry, as kvgeom's geometry files state it.
    pub geometry: Geometry,
    /// The prefill engine's ranks, pool and request blocks.
    pub prefill: SideSpec,
    /// The decode engine's ranks, pool and request blocks.
    pub decode: SideSpec,
    /// Test hook: the driver skips vLLM's receive post-process (the bytes
    /// then stay as the READs left them). Omitted when false.
    #[serde(skip_serializing_if = "std::ops::Not::not", default)]
    pub skip_receive_post_process: bool,
    /// Test hook (push cases): the case's thread stays blocked inside the
    /// case with vLLM's workers alive, so the driver's time-out and restart
    /// are exercised. Omitted when false.
    #[serde(skip_serializing_if = "std::ops::Not::not", default)]
    pub block_in_case: bool,
    /// How the request reaches vLLM's workers: `scheduler` (the place
    /// phase's `place.json` and metadata in the case's folder) or `direct`.
    /// Omitted when direct (a trace without it was recorded direct).
    #[serde(skip_serializing_if = "RequestPath::is_direct", default)]
    pub requests: RequestPath,
}

/// One engine of a case.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SideSpec {
    /// Ranks of the engine.
    pub tp_size: u32,
    /// Logical blocks of the engine's pool.
    pub num_logical_blocks: u32,
    /// Bytes of one logical block of one layer slot (the unified page).
    pub page_bytes: u64,
    /// Layer slots: shared tensors per rank, one memory file each.
    pub regions: u32,
    /// Bytes of each region.
    pub region_bytes: u64,
    /// The request's logical block ids per KV-cache group.
    pub request_blocks: Vec<Vec<u32>>,
    /// Decode only: the blocks the transfer fills (after the prefix hit).
    pub transfer_blocks: Vec<Vec<u32>>,
    /// Decode only: prefix-hit blocks per group.
    pub computed_blocks: Vec<u32>,
}

/// The agent names kvgeom uses: `prefill-<rank>`, `decode-<rank>`.
pub fn memory_file(case_dir: &Path, agent: &str, region: u32, stage: &str) -> PathBuf {
    case_dir.join(format!("{agent}.r{region}.{stage}"))
}

/// What the driver reports for one case.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct CaseResult {
    /// `RESULT_FORMAT`.
    pub format: String,
    /// `done`, `rejected` (handshake refused), `crashed` (vLLM raised
    /// after the handshake), `hung` (did not complete within the time-out)
    /// or `error` (the driver could not build the case).
    pub status: String,
    /// `prefill` or `decode`: the engine that refused or raised.
    #[serde(default)]
    pub side: Option<String>,
    /// vLLM's exception text, or why the driver gave up.
    #[serde(default)]
    pub message: Option<String>,
    /// vLLM's tensor of each region, per agent: `(data_ptr, bytes)`.
    #[serde(default)]
    pub regions: BTreeMap<String, Vec<(u64, u64)>>,
    /// Every descriptor list vLLM prepared.
    #[serde(default)]
    pub dlists: Vec<DlistRecord>,
    /// Every transfer vLLM made, in order.
    #[serde(default)]
    pub xfers: Vec<XferRecord>,
    /// Receive post-process calls, as the driver saw them.
    #[serde(default)]
    pub post_process: Vec<serde_json::Value>,
    /// Every call of a decode rank's receive post-process, as vLLM made it
    /// (absent from results of drivers before it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub post_process_calls: Vec<PostProcessCall>,
    /// Every call of a decode rank's region-mapped zeroing
    /// (`_zero_region_blocks`, taken when P's and D's cache-group layouts
    /// differ; absent from results of drivers before it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub region_zero_calls: Vec<RegionZeroCall>,
    /// Every handshake a rank attempted with a peer rank.
    #[serde(default)]
    pub handshakes: Vec<HandshakeRecord>,
    /// What moved the bytes: `stand-in` or `real` (absent: the stand-in).
    #[serde(default)]
    pub nixl: Option<String>,
    /// The real NIXL's version.
    #[serde(default)]
    pub nixl_version: Option<String>,
    /// Push: every failure vLLM logged (`{agent, failure_type, error}`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failures: Vec<serde_json::Value>,
    /// Push: exceptions of the push path (`{agent, in, message, trace}`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub raised: Vec<serde_json::Value>,
    /// Push: every notification delivered (`{from, to, text}`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notifs: Vec<serde_json::Value>,
    /// The stack of the exception (or of the blocked thread), when any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<String>,
    /// How the request reached the workers (`scheduler` or `direct`; absent
    /// from results of drivers before it: direct).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_path: Option<String>,
}

/// A prepared descriptor list, rows expanded to `(addr, len, dev)`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
pub struct DlistRecord {
    /// The agent that prepared the list.
    pub agent: String,
    /// The list's handle, as the transfers name it.
    pub handle: u64,
    /// `local`, or the remote agent's name.
    pub target: String,
    /// The NIXL memory type the list was prepared with (`DRAM` or `VRAM`).
    pub mem: String,
    /// One `(address, length in bytes, device)` per descriptor.
    pub rows: Vec<(u64, u64, u32)>,
}

/// One transfer vLLM made.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
pub struct XferRecord {
    /// The agent that posted the transfer.
    pub agent: String,
    /// `READ` or `WRITE`.
    pub op: String,
    /// Handle of the local list.
    pub local: u64,
    /// Desc ids into the local list; position k pairs with `remote_ids[k]`.
    pub local_ids: Vec<u32>,
    /// Handle of the remote list.
    pub remote: u64,
    /// Desc ids into the remote list.
    pub remote_ids: Vec<u32>,
    /// Whether the transfer was posted (not only created).
    pub posted: bool,
}

/// One call of vLLM's `post_process_device_kv_on_receive` on a decode rank.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PostProcessCall {
    /// The decode agent.
    pub agent: String,
    /// Local kernel block / remote kernel block.
    pub block_size_ratio: u32,
    /// Per request and attention group: `(group, local kernel block ids,
    /// remote-sized sub-blocks the transfer covered)`; the covered
    /// sub-blocks are a count or, from vLLM 0.34.0, a range
    /// ([`CoveredRange`](super::covered_range::CoveredRange)).
    pub block_ids_list: Vec<(u32, Vec<u32>, super::covered_range::CoveredRange)>,
    /// Whether vLLM asked for the block-size or layout conversion.
    pub convert: bool,
    /// The byte ranges the call set to zero, `(addr, len)` in the agent's
    /// regions; `None` when not measured (regions above the driver's limit,
    /// or a call that raised; absent from drivers before it).
    #[serde(default)]
    pub zeroed: Option<Vec<(u64, u64)>>,
}

/// One call of vLLM's `_zero_region_blocks` on a decode rank.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RegionZeroCall {
    /// The decode agent.
    pub agent: String,
    /// Per region, the kernel blocks cleared.
    pub region_block_ids: Vec<Vec<u32>>,
    /// The byte ranges the call set to zero, as in [`PostProcessCall`].
    #[serde(default)]
    pub zeroed: Option<Vec<(u64, u64)>>,
}

/// How a case's request reaches vLLM's workers (`request_path` of the
/// driver's result, the reports and the traces).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RequestPath {
    /// The driver builds the request from kvgeom's placement.
    #[default]
    Direct,
    /// vLLM's scheduler placed the request and built the workers' metadata.
    Scheduler,
}

impl RequestPath {
    /// `direct` or `scheduler`.
    pub fn as_str(self) -> &'static str {
        match self {
            RequestPath::Direct => "direct",
            RequestPath::Scheduler => "scheduler",
        }
    }

    /// Whether this is the direct path (serde's skip test).
    pub fn is_direct(&self) -> bool {
        *self == RequestPath::Direct
    }
}
