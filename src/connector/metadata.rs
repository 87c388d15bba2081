//! The handshake metadata an engine rank publishes (vLLM's `NixlAgentMetadata`).

use serde::{Deserialize, Serialize};

use crate::geometry::KvLayout;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HandshakeMetadata {
    pub engine_id: String,
    /// The NIXL agent blob a peer loads.
    pub agent_metadata: Vec<u8>,
    pub device_id: u32,
    /// Region base addresses, in region order.
    pub kv_caches_base_addr: Vec<u64>,
    /// Kernel blocks per region.
    pub num_blocks: u64,
    /// Bytes of one kernel block, per region.
    pub block_lens: Vec<u64>,
    /// Bytes between consecutive kernel blocks, per region.
    pub block_strides: Vec<u64>,
    pub kv_cache_layout: KvLayout,
    /// Kernel block size in tokens.
    pub block_size: u32,
    /// `(conv_size, ssm_size)` of this rank.
    pub ssm_sizes: (u64, u64),
    pub physical_blocks_per_logical_kv_block: u32,
    pub host_buffer: bool,
}
