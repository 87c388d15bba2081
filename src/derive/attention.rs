//! One rank's attention KV cache per token (vLLM 0.33.0's
//! `FullAttentionSpec` / `MLAAttentionSpec` page size for one token).

use serde::Serialize;

use super::dtype::CacheDtype;
use super::families::{AttentionArch, ModelArch};

/// One rank's attention KV cache of one layer: the heads it holds and the
/// bytes one token takes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AttentionSizes {
    /// `"full"` (K and V per head, heads sharded) or `"mla"` (one latent, replicated).
    pub kind: &'static str,
    /// KV heads over all ranks (1 for MLA).
    pub total_kv_heads: u64,
    /// `max(1, total / tp)`; 1 for MLA.
    pub kv_heads_per_rank: u64,
    /// Elements per head; the latent width for MLA.
    pub head_size: u64,
    /// Bytes per element of the KV cache dtype (the model dtype for `auto`).
    pub dtype_bytes: u64,
    /// Bytes of one token of one layer on one rank.
    pub bytes_per_token: u64,
}

impl AttentionSizes {
    /// The sizes on one rank of a `tp`-way engine whose KV cache holds
    /// `cache_dtype`: full attention takes `2 x kv_heads_per_rank x head_size
    /// x dtype_bytes` bytes per token, MLA `head_size x dtype_bytes` on every
    /// rank.
    pub fn of(model: &ModelArch, tp: u64, cache_dtype: CacheDtype) -> AttentionSizes {
        let dtype_bytes = cache_dtype.resolve(model.dtype).bytes();
        let head_size = model.attention.head_size();
        match model.attention {
            AttentionArch::Full { total_kv_heads, .. } => {
                let per_rank = (total_kv_heads / tp).max(1);
                AttentionSizes {
                    kind: "full",
                    total_kv_heads,
                    kv_heads_per_rank: per_rank,
                    head_size,
                    dtype_bytes,
                    bytes_per_token: 2 * per_rank * head_size * dtype_bytes,
                }
            }
            AttentionArch::Mla { .. } => AttentionSizes {
                kind: "mla",
                total_kv_heads: 1,
                kv_heads_per_rank: 1,
                head_size,
                dtype_bytes,
                bytes_per_token: head_size * dtype_bytes,
            },
        }
    }
}
