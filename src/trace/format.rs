//! The shape of one `vllm-nixl-geometry-trace/1` line, as typed events.
//!
//! Each `ev` has a payload struct; fields a struct does not name are
//! ignored, so newer traces with extra fields still read. `dlist` events are
//! read through [`RawDlist`] and checked by the reader before they become a
//! [`DlistEvent`] (whose rows are always rebuilt from the strided runs).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::nixl::{DescList, DlistHandle, DlistTarget, MemKind, XferHandle, XferOp};

/// The `format` string of the `meta` event this reader understands.
pub const FORMAT_NAME: &str = "vllm-nixl-geometry-trace/1";

/// vLLM's name for "the initiator's own memory" as a dlist target.
pub const LOCAL_TARGET: &str = "NIXL_INIT_AGENT";

/// A strided run as vLLM writes it: `[addr, len, dev, stride, count]`.
pub type RawStridedRun = (u64, u64, u32, u64, u64);

/// Every `ev` value, in the order of [`TraceEvent`]'s variants.
pub const EVENT_NAMES: [&str; 13] = [
    "meta",
    "case",
    "make_worker",
    "nixl_agent",
    "register_memory",
    "dlist",
    "local_geometry",
    "make_remote_meta",
    "add_remote_agent",
    "request",
    "xfer",
    "request_done",
    "result",
];

/// One event of a trace.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub enum TraceEvent {
    /// `meta`: the test that recorded the trace.
    Meta(Meta),
    /// `case`: the sweep helper's arguments.
    Case(CaseEvent),
    /// `make_worker`: the local worker's configuration.
    MakeWorker(MakeWorker),
    /// `nixl_agent`: a NIXL agent was created.
    NixlAgent(NixlAgent),
    /// `register_memory`: the local worker registered its tensors.
    RegisterMemory(RegisterMemory),
    /// `dlist`: a descriptor list was prepared.
    Dlist(DlistEvent),
    /// `local_geometry`: what the local worker derived at registration.
    LocalGeometry(LocalGeometry),
    /// `make_remote_meta`: the arguments of the synthetic remote engine.
    MakeRemoteMeta(MakeRemoteMeta),
    /// `add_remote_agent`: one remote rank's handshake.
    AddRemoteAgent(AddRemoteAgent),
    /// `request`: the request's block ids.
    Request(RequestEvent),
    /// `xfer`: a transfer was made.
    Xfer(XferEvent),
    /// `request_done`: the request's ids after the read.
    RequestDone(RequestDone),
    /// `result`: how the test ended.
    Result(ResultEvent),
}

impl TraceEvent {
    /// The `ev` value of this event.
    pub fn name(&self) -> &'static str {
        let index = match self {
            TraceEvent::Meta(_) => 0,
            TraceEvent::Case(_) => 1,
            TraceEvent::MakeWorker(_) => 2,
            TraceEvent::NixlAgent(_) => 3,
            TraceEvent::RegisterMemory(_) => 4,
            TraceEvent::Dlist(_) => 5,
            TraceEvent::LocalGeometry(_) => 6,
            TraceEvent::MakeRemoteMeta(_) => 7,
            TraceEvent::AddRemoteAgent(_) => 8,
            TraceEvent::Request(_) => 9,
            TraceEvent::Xfer(_) => 10,
            TraceEvent::RequestDone(_) => 11,
            TraceEvent::Result(_) => 12,
        };
        EVENT_NAMES[index]
    }

    /// The recording agent the event belongs to, for events that name one.
    pub fn agent(&self) -> Option<u32> {
        match self {
            TraceEvent::NixlAgent(e) => Some(e.agent),
            TraceEvent::RegisterMemory(e) => Some(e.agent),
            TraceEvent::Dlist(e) => Some(e.agent),
            TraceEvent::LocalGeometry(e) => Some(e.agent),
            TraceEvent::AddRemoteAgent(e) => Some(e.agent),
            TraceEvent::Request(e) => Some(e.agent),
            TraceEvent::Xfer(e) => Some(e.agent),
            TraceEvent::RequestDone(e) => Some(e.agent),
            _ => None,
        }
    }
}

/// `meta`: what produced the trace.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Meta {
    /// The trace format's name ([`FORMAT_NAME`]).
    pub format: String,
    /// The pytest node id of the recording test.
    pub nodeid: String,
    /// The test function's name.
    pub test: String,
    /// The test's pytest parameters (empty for unparametrised tests).
    #[serde(default)]
    pub params: BTreeMap<String, Value>,
    /// The vLLM version recorded.
    pub vllm: String,
}

/// `case`: the arguments of the test's case helper.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CaseEvent {
    #[serde(rename = "fn")]
    /// The helper's name.
    pub function: String,
    /// Its arguments.
    pub args: CaseArgs,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
/// The arguments of vLLM's heterogeneous-geometry sweep helper.
pub struct CaseArgs {
    /// D's logical block size, in tokens.
    pub local_block: u32,
    /// D's kernel block size, in tokens.
    pub kernel: u32,
    /// P's logical block size, in tokens.
    pub remote_block: u32,
    /// The prompt length, in tokens.
    pub num_tokens: u32,
    /// P's TP size.
    pub tp_size: u32,
    /// `None`: same as `kernel`.
    pub remote_kernel: Option<u32>,
    /// P's decode context parallel size.
    pub remote_dcp_size: u32,
    /// The helper's `cached` argument: decode's prefix-hit logical blocks
    /// (0 in vLLM's own sweep).
    pub cached: u32,
    /// D's decode context parallel size.
    pub local_dcp_size: u32,
    /// D's TP rank.
    pub local_rank: u32,
    #[serde(flatten)]
    /// Every other argument, verbatim.
    pub other: BTreeMap<String, Value>,
}

/// `make_worker`: how the local (decode) worker was built.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MakeWorker {
    #[serde(rename = "fn")]
    /// The helper's name.
    pub function: String,
    /// Its arguments.
    pub args: WorkerArgs,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
/// The arguments the local worker was built with.
pub struct WorkerArgs {
    /// Logical block size in tokens.
    pub local_block_size: u32,
    /// Kernel block size, in tokens.
    pub kernel_block_size: u32,
    /// Logical blocks in the pool.
    pub num_logical_blocks: u32,
    /// TP size.
    pub tp_size: u32,
    /// TP rank.
    pub tp_rank: u32,
    #[serde(default = "one")]
    /// Decode context parallel size (1 when absent).
    pub dcp_size: u32,
}

fn one() -> u32 {
    1
}

/// `nixl_agent`: a recording stand-in was created.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NixlAgent {
    /// The recording agent's number.
    pub agent: u32,
    /// The Python class that stands in for the agent.
    pub cls: String,
}

/// One registered region `[addr, len, dev, name]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "(u64, u64, u32, String)", into = "(u64, u64, u32, String)")]
pub struct TraceRegion {
    /// Start address.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// Device ordinal.
    pub dev: u32,
    /// The tensor's name in vLLM.
    pub name: String,
}

impl From<(u64, u64, u32, String)> for TraceRegion {
    fn from((addr, len, dev, name): (u64, u64, u32, String)) -> Self {
        Self {
            addr,
            len,
            dev,
            name,
        }
    }
}

impl From<TraceRegion> for (u64, u64, u32, String) {
    fn from(r: TraceRegion) -> Self {
        (r.addr, r.len, r.dev, r.name)
    }
}

/// `register_memory`: the local worker's KV regions.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RegisterMemory {
    /// The recording agent's number.
    pub agent: u32,
    /// The regions, in registration order.
    pub regions: Vec<TraceRegion>,
    #[serde(default)]
    /// NIXL backends named at registration.
    pub backends: Vec<String>,
}

/// `dlist` as written: strided runs `[addr, len, dev, stride, count]` and,
/// optionally, the expanded rows `[addr, len, dev]`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct RawDlist {
    /// The recording agent's number.
    pub agent: u32,
    /// The handle vLLM got.
    pub handle: u64,
    /// [`LOCAL_TARGET`] or the remote agent's name.
    pub target: String,
    /// The memory type the list was prepared with.
    pub mem_type: MemKind,
    /// The rows as strided runs.
    pub strided: Vec<RawStridedRun>,
    #[serde(default)]
    /// The expanded rows, when the trace carries them (checked against `strided`).
    pub rows: Option<Vec<(u64, u64, u32)>>,
}

/// `dlist`: a prepared descriptor list. Desc ids index `list`'s expanded rows.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DlistEvent {
    /// The recording agent's number.
    pub agent: u32,
    /// The handle vLLM got.
    pub handle: DlistHandle,
    /// `Local` for vLLM's `NIXL_INIT_AGENT`, otherwise the remote agent name.
    pub target: DlistTarget,
    /// The memory type the list was prepared with.
    pub mem: MemKind,
    /// The rows.
    pub list: DescList,
}

/// The worker's derived geometry (`local_geometry` and `request_done`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WorkerGeometry {
    /// The worker's engine id.
    pub engine_id: String,
    /// The worker's TP rank.
    pub tp_rank: u32,
    /// The worker's TP size.
    pub world_size: u32,
    /// The attention is MLA.
    pub use_mla: bool,
    #[serde(rename = "_has_mamba")]
    /// The model has mamba groups.
    pub has_mamba: bool,
    /// The KV layout as vLLM names it (e.g. `HND`).
    pub kv_cache_layout: String,
    /// Kernel block size in tokens.
    pub block_size: u32,
    /// Kernel blocks per region.
    pub num_blocks: u64,
    #[serde(rename = "_logical_num_blocks")]
    /// Logical blocks per region.
    pub logical_num_blocks: u64,
    /// Kernel blocks per logical block (ppl).
    #[serde(rename = "_physical_blocks_per_logical_kv_block")]
    pub physical_blocks_per_logical: u32,
    /// Registered regions.
    pub num_regions: u32,
    /// Rows of the worker's own local list.
    pub num_descs: u64,
    /// Bytes of one kernel block, per region.
    pub block_len_per_layer: Vec<u64>,
    /// Bytes between consecutive kernel blocks, per region.
    pub block_stride_per_layer: Vec<u64>,
    /// Kernel blocks, per region.
    pub region_num_blocks: Vec<u64>,
    /// The tensor name of each region.
    pub region_names: Vec<String>,
    /// The memory type of each region.
    pub region_mem_types: Vec<MemKind>,
    #[serde(rename = "_region_is_mla")]
    /// Whether each region holds MLA (replicated) pages.
    pub region_is_mla: Vec<bool>,
    #[serde(rename = "_ssm_region_indices")]
    /// Indices of the regions holding mamba state.
    pub ssm_region_indices: Vec<u32>,
    /// Mamba `(conv, ssm)` state sizes in bytes.
    #[serde(rename = "_mamba_ssm_size", default)]
    pub mamba_ssm_size: Option<Vec<u64>>,
    /// The memory type vLLM prepares handshake lists with.
    pub nixl_memory_type: MemKind,
    /// KV is staged through host buffers.
    pub use_host_buffer: bool,
    /// Region base addresses per key (vLLM keys them by rank).
    #[serde(default)]
    pub local_base_addrs: BTreeMap<String, Vec<u64>>,
    /// vLLM's raw local strided rows; redundant with the first local dlist
    /// and dropped from the project's fixtures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub src_blocks_data: Option<Vec<RawStridedRun>>,
    #[serde(flatten)]
    /// Every other attribute, verbatim (`dcp_size`, `pcp_size`, `pp_size`,
    /// `_is_csa_linear`, `region_group_ids`, ...; docs/trace-format.md says
    /// which are refused when not at their default).
    pub other: BTreeMap<String, Value>,
}

/// `local_geometry`: the local worker after registration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LocalGeometry {
    /// The recording agent's number.
    pub agent: u32,
    /// The worker's Python class.
    pub worker_cls: String,
    #[serde(default)]
    /// The exception registration raised, if any (as recorded).
    pub exception: Option<Value>,
    /// The derived geometry (absent when registration raised).
    pub geometry: Option<WorkerGeometry>,
}

/// `make_remote_meta`: how the synthetic remote metadata was built.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MakeRemoteMeta {
    #[serde(rename = "fn")]
    /// The helper's name.
    pub function: String,
    /// Its arguments.
    pub args: RemoteArgs,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
/// The arguments of the synthetic remote engine.
pub struct RemoteArgs {
    /// P's logical block size, in tokens.
    pub remote_block_size: u32,
    /// P's kernel block size, in tokens.
    pub remote_kernel_block_size: u32,
    /// P's logical blocks per region.
    pub remote_num_logical: u32,
    #[serde(default)]
    /// P's mamba `(conv, ssm)` state sizes in bytes (empty without mamba).
    pub remote_ssm_sizes: Vec<u64>,
}

/// `add_remote_agent`: one remote rank's handshake.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AddRemoteAgent {
    /// The recording agent's number.
    pub agent: u32,
    /// Which remote rank.
    pub args: RemoteRankArgs,
    /// What the rank sent.
    pub remote_meta: RemoteMeta,
    /// The remote agent name the call returned.
    pub result: Option<String>,
    #[serde(default)]
    /// The exception the handshake raised, if any (as recorded).
    pub exception: Option<Value>,
    /// The remote dlist prepared for this rank.
    #[serde(default)]
    pub dst_handle: Option<DlistHandle>,
    #[serde(default)]
    /// The remote's kernel block count, when recorded.
    pub dst_num_blocks: Option<u64>,
    #[serde(default)]
    /// The remote's kernel block count per region, when recorded.
    pub dst_region_num_blocks: Option<Vec<u64>>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
/// The rank a handshake is with.
pub struct RemoteRankArgs {
    /// The remote TP rank.
    pub remote_tp_rank: u32,
    /// The remote engine's TP size.
    pub remote_tp_size: u32,
    #[serde(default = "one")]
    /// The remote engine's decode context parallel size (1 when absent).
    pub remote_dcp_size: u32,
}

/// The handshake metadata one remote rank sent. Fields not named here are
/// kept in `other`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RemoteMeta {
    /// The remote engine's id.
    pub engine_id: String,
    /// Region base addresses, in region order.
    pub kv_caches_base_addr: Vec<u64>,
    /// The rank's device ordinal.
    pub device_id: u32,
    /// Kernel blocks per region.
    pub num_blocks: u64,
    /// Bytes of one kernel block, per region.
    pub block_lens: Vec<u64>,
    #[serde(default)]
    /// Bytes between consecutive kernel blocks, per region (absent in older traces).
    pub block_strides: Option<Vec<u64>>,
    /// The KV layout as vLLM names it.
    pub kv_cache_layout: String,
    /// Kernel block size in tokens.
    pub block_size: u32,
    #[serde(default)]
    /// Mamba `(conv, ssm)` state sizes in bytes, when sent.
    pub ssm_sizes: Option<Vec<u64>>,
    /// Kernel blocks per logical block (ppl).
    pub physical_blocks_per_logical_kv_block: u32,
    #[serde(default)]
    /// Kernel blocks per region, when they differ by region.
    pub region_num_blocks: Option<Vec<u64>>,
    #[serde(default)]
    /// The attention backend's name, when sent.
    pub attn_backend_name: Option<String>,
    #[serde(default)]
    /// Decode context parallel size, when sent.
    pub dcp_size: Option<u32>,
    #[serde(default)]
    /// Prefill context parallel size, when sent.
    pub pcp_size: Option<u32>,
    #[serde(default)]
    /// The memory type of each region, when sent.
    pub region_mem_types: Option<Vec<MemKind>>,
    #[serde(flatten)]
    /// Every other field of the metadata, verbatim.
    pub other: BTreeMap<String, Value>,
}

impl RemoteMeta {
    /// Byte length of each remote region as far as the metadata tells:
    /// blocks of the region times its block stride (block length when no
    /// strides are sent).
    pub fn region_lens(&self) -> Vec<u64> {
        (0..self.kv_caches_base_addr.len())
            .map(|i| {
                let blocks = self
                    .region_num_blocks
                    .as_ref()
                    .and_then(|b| b.get(i).copied())
                    .unwrap_or(self.num_blocks);
                let stride = self
                    .block_strides
                    .as_ref()
                    .and_then(|s| s.get(i).copied())
                    .or_else(|| self.block_lens.get(i).copied())
                    .unwrap_or(0);
                blocks.saturating_mul(stride)
            })
            .collect()
    }
}

/// Block ids of a request, per KV-cache group.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestBlocks {
    /// Logical local block ids per group.
    pub local_block_ids: Vec<Vec<u64>>,
    /// Kernel local block ids per group.
    pub local_physical_block_ids: Vec<Vec<u64>>,
    #[serde(default)]
    /// D's prefix-cache hit: logical blocks per group already computed.
    pub local_num_computed_blocks: Vec<u64>,
    /// Logical remote block ids per group (kernel ids after the read).
    pub remote_block_ids: Vec<Vec<u64>>,
    /// The remote (prefill) engine's id.
    pub remote_engine_id: String,
    /// The remote engine's TP size.
    pub tp_size: u32,
    #[serde(default = "one")]
    /// The remote engine's decode context parallel size (1 when absent).
    pub dcp_size: u32,
}

/// `request`: the request at the start of the read.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RequestEvent {
    /// The recording agent's number.
    pub agent: u32,
    /// The request id.
    pub req_id: String,
    /// Prompt length N (`None` when the test sets block ids directly).
    pub prompt_len: Option<u32>,
    /// Tokens whose KV is read (N - 1 for hybrid models).
    pub matched_tokens: Option<u32>,
    #[serde(flatten)]
    /// The request's block ids.
    pub blocks: RequestBlocks,
}

/// `xfer`: one prepared transfer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct XferEvent {
    /// The recording agent's number.
    pub agent: u32,
    /// The handle vLLM got.
    pub handle: XferHandle,
    /// READ or WRITE.
    pub op: XferOp,
    /// The local list's handle.
    pub local_handle: DlistHandle,
    /// Rows of the local list, one per pair.
    pub local_ids: Vec<u32>,
    /// The remote list's handle.
    pub remote_handle: DlistHandle,
    /// Rows of the remote list, paired index by index with `local_ids`.
    pub remote_ids: Vec<u32>,
    #[serde(default)]
    /// The notification delivered on completion, if any.
    pub notif_msg: Option<String>,
}

/// `request_done`: the request after the read.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RequestDone {
    /// The recording agent's number.
    pub agent: u32,
    /// The request id.
    pub req_id: String,
    #[serde(default)]
    /// The exception completing the request raised, if any (as recorded).
    pub exception: Option<Value>,
    /// The request's block ids after the read (remote ids rewritten to kernel ids).
    pub after_call: Option<RequestBlocks>,
    #[serde(default)]
    /// The worker's geometry after the request, when recorded.
    pub geometry: Option<WorkerGeometry>,
}

/// `result`: the test's outcome.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ResultEvent {
    /// pytest's outcome (`passed`, `failed`, ...).
    pub outcome: String,
    #[serde(default)]
    /// The test's duration, in seconds.
    pub duration_s: Option<f64>,
    #[serde(default)]
    /// pytest's failure message, if any.
    pub message: Option<String>,
}
