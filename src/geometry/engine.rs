//! Per-engine geometry (prefill or decode): TP size, kernel and logical block
//! sizes, pool size, layout and buffer mode.

use serde::{Deserialize, Serialize};

use super::model::{KvLayout, ModelSpec};

/// The block geometry of one engine (all of its TP ranks share it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EngineGeometry {
    /// Tensor-parallel ranks of this engine.
    pub tp_size: u32,
    /// Kernel (physical page) block size in tokens: the attention backend's page.
    pub kernel_block: u32,
    /// Logical (scheduler) block size in tokens; a multiple of `kernel_block`.
    pub logical_block: u32,
    /// Logical blocks in each rank's pool; `None` lets the scenario size the pool.
    pub num_logical_blocks: Option<u32>,
    /// How each kernel page orders heads and tokens.
    pub layout: KvLayout,
    /// KV staged through host buffers (`kv_buffer_device = "cpu"`).
    pub host_buffer: bool,
    /// Prefix caching is on: D may already hold a prefix of the prompt.
    pub prefix_caching: bool,
    /// Padding bytes after every kernel page (interleaved or padded layouts):
    /// the kernel block stride is `kernel page + padding`.
    #[serde(default)]
    pub block_padding_bytes: u64,
}

impl Default for EngineGeometry {
    /// TP1, 16-token kernel and logical blocks, a pool the scenario sizes,
    /// token-major pages, no host buffer, no prefix caching, no padding.
    fn default() -> Self {
        EngineGeometry {
            tp_size: 1,
            kernel_block: 16,
            logical_block: 16,
            num_logical_blocks: None,
            layout: KvLayout::Nhd,
            host_buffer: false,
            prefix_caching: false,
            block_padding_bytes: 0,
        }
    }
}

impl EngineGeometry {
    /// An engine of `tp_size` ranks with these block sizes, the rest default.
    pub fn new(tp_size: u32, kernel_block: u32, logical_block: u32) -> Self {
        EngineGeometry {
            tp_size,
            kernel_block,
            logical_block,
            ..EngineGeometry::default()
        }
    }

    /// Physical (kernel) blocks per logical block.
    pub fn ppl(&self) -> u32 {
        self.logical_block / self.kernel_block
    }

    /// Bytes of one kernel page (the tokens of one kernel block) of one layer
    /// slot on one rank, without padding.
    pub fn kernel_page_bytes(&self, model: &ModelSpec) -> u64 {
        let per_token = model
            .attention
            .as_ref()
            .map_or(0, |a| a.bytes_per_token(self.tp_size));
        per_token * u64::from(self.kernel_block)
    }

    /// Bytes between consecutive kernel blocks (page plus padding).
    pub fn kernel_block_stride(&self, model: &ModelSpec) -> u64 {
        self.kernel_page_bytes(model) + self.block_padding_bytes
    }

    /// Bytes of one logical block of one layer slot on one rank: the unified
    /// page shared by attention and (padded) mamba state.
    pub fn unified_page_bytes(&self, model: &ModelSpec) -> u64 {
        self.kernel_block_stride(model) * u64::from(self.ppl())
    }
}

/// `tp_ratio` as computed by the side whose TP size is `local_tp`:
/// `local / remote` when local >= remote, else `-(remote / local)`.
/// `None` when neither divides the other.
pub fn tp_ratio(local_tp: u32, remote_tp: u32) -> Option<i32> {
    if local_tp >= remote_tp {
        (local_tp % remote_tp == 0).then(|| (local_tp / remote_tp) as i32)
    } else {
        (remote_tp % local_tp == 0).then(|| -((remote_tp / local_tp) as i32))
    }
}

/// `block_size_ratio` as computed by the local side: local kernel / remote
/// kernel. `None` unless the local kernel block is a multiple of the remote one.
pub fn block_size_ratio(local_kernel: u32, remote_kernel: u32) -> Option<u32> {
    (remote_kernel != 0 && local_kernel % remote_kernel == 0).then(|| local_kernel / remote_kernel)
}
