//! The handshake metadata an engine rank publishes (vLLM's `NixlAgentMetadata`).

use serde::{Deserialize, Serialize};

use crate::geometry::{CompatFactors, KvLayout};
use crate::memory::MemKind;

/// What one rank tells its peers at handshake (vLLM's `NixlAgentMetadata`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HandshakeMetadata {
    /// The engine the rank belongs to.
    pub engine_id: String,
    /// The NIXL agent blob a peer loads.
    pub agent_metadata: Vec<u8>,
    /// The rank's device ordinal.
    pub device_id: u32,
    /// Region base addresses, in region order.
    pub kv_caches_base_addr: Vec<u64>,
    /// Kernel blocks per region.
    pub num_blocks: u64,
    /// Bytes of one kernel block, per region.
    pub block_lens: Vec<u64>,
    /// Bytes between consecutive kernel blocks, per region.
    pub block_strides: Vec<u64>,
    /// How each kernel page orders heads and tokens.
    pub kv_cache_layout: KvLayout,
    /// Kernel block size in tokens.
    pub block_size: u32,
    /// `(conv_size, ssm_size)` of this rank.
    pub ssm_sizes: (u64, u64),
    /// Kernel blocks per logical block (ppl).
    pub physical_blocks_per_logical_kv_block: u32,
    /// KV is staged through host buffers.
    pub host_buffer: bool,
    /// The memory type of each region, when the rank advertises them (vLLM's
    /// `region_mem_types`); a peer prepares its list of this rank with it,
    /// else with its platform's type.
    #[serde(default)]
    pub region_mem_types: Option<Vec<MemKind>>,
    /// What the rank's compatibility hash covers that a pair can differ in
    /// (vLLM sends the hash; kvgeom sends the factors, to name the ones
    /// that differ); `None` when unknown (a recorded trace).
    #[serde(default)]
    pub compat_factors: Option<CompatFactors>,
}
