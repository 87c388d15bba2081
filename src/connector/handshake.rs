//! Handshake compatibility checks: every check vLLM 0.33.0 runs when a local
//! worker adds a remote rank, with the same accept/reject decisions and
//! messages that say what is unsupported.

use super::metadata::HandshakeMetadata;
use super::policy::{Acceptance, Policy, PushBlockSizes};
use super::registration::Registration;
use super::split_lists::SplitError;
use crate::geometry::{mismatch_text, FactorDifference, KvLayout, ModelSpec};

/// A refused handshake.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HandshakeError {
    #[error(
        "{}; vLLM refuses the pair before any geometry rule unless \
         kv_connector_extra_config sets enforce_handshake_compat to false",
        mismatch_text(differences)
    )]
    /// The engines' compatibility hashes differ (vLLM's
    /// `compute_nixl_compatibility_hash`): the factors that differ.
    CompatibilityHashMismatch {
        /// Each differing factor, this engine's value and the peer's.
        differences: Vec<FactorDifference>,
    },
    #[error(
        "Local block size {local} is not divisible by remote block size {remote} or vice versa."
    )]
    /// Neither engine's kernel block size divides the other's.
    BlockSizeNotDivisible {
        /// This engine's kernel block size, in tokens.
        local: u32,
        /// The peer's kernel block size, in tokens.
        remote: u32,
    },
    #[error(
        "NIXL pull does not yet support a mixed-memory producer: the peer's regions are {types:?}"
    )]
    /// The peer advertises regions of different memory types.
    MixedMemoryPeer {
        /// The memory type of each of the peer's regions.
        types: Vec<crate::memory::MemKind>,
    },
    #[error("TP sizes are not multiples of one another: local {local}, remote {remote}")]
    /// Neither TP size divides the other.
    TpNotDivisible {
        /// This engine's TP size.
        local: u32,
        /// The peer's TP size.
        remote: u32,
    },
    #[error(
        "P_TP > D_TP with replicated KV heads is not supported for dense attention \
         (remote TP {remote_tp} > {total_heads} KV heads)"
    )]
    /// Dense attention would read replicated KV heads from several prefill ranks.
    ReplicatedKvMultiRead {
        /// The prefill engine's TP size.
        remote_tp: u32,
        /// The model's KV heads, over all ranks.
        total_heads: u32,
    },
    #[error(
        "Prefix caching with heterogeneous physical_blocks_per_logical is not supported for Mamba \
         hybrid models. Local: {local}, Remote: {remote}. Disable prefix caching with --disable-prefix-caching."
    )]
    /// Prefix caching on a mamba hybrid whose engines differ in ppl.
    PrefixCachingHeteroPpl {
        /// This engine's kernel blocks per logical block.
        local: u32,
        /// The peer's kernel blocks per logical block.
        remote: u32,
    },
    #[error(
        "Heterogeneous block sizes are not supported with host buffer (block_size_ratio={ratio})"
    )]
    /// Host-buffer staging with different kernel block sizes.
    HostBufferWithRatio {
        /// The block-size ratio between the engines' kernel blocks.
        ratio: u32,
    },
    #[error(
        "Heterogeneous TP expects same kv_cache_layout (local {local}, remote {remote}); \
         receiving LBHNC into LBNHC needs enable_permute_local_kv, which the hybrid allocator does not support"
    )]
    /// Heterogeneous TP across different KV layouts.
    LayoutMismatch {
        /// This engine's `kv_cache_layout` (e.g. `LBHNC`).
        local: &'static str,
        /// The peer's `kv_cache_layout`.
        remote: &'static str,
    },
    #[error(
        "Heterogeneous TP head-dimension splitting requires contiguous heads. \
         Use a block-contiguous layout (e.g. LBHNC) on the prefill side."
    )]
    /// Splitting heads across ranks needs head-major (block-contiguous) pages.
    HeadSplitNeedsContiguousLayout,
    #[error(
        "Hybrid MLA kernel-granularity block lengths must match between P and D \
         (block_size_ratio={ratio}): local={local:?}, remote={remote:?}."
    )]
    /// A hybrid MLA pair whose kernel-granularity block lengths differ.
    HybridMlaBlockLens {
        /// The block-size ratio between the engines' kernel blocks.
        ratio: u32,
        /// This engine's block length per region, in bytes.
        local: Vec<u64>,
        /// The peer's block length per region, in bytes.
        remote: Vec<u64>,
    },
    #[error("Number of KV layers must match between prefill and decode (local {local}, remote {remote})")]
    /// The engines register different numbers of KV regions (layer slots).
    RegionCount {
        /// This engine's regions.
        local: usize,
        /// The peer's regions.
        remote: usize,
    },
    #[error("KV cache sizes must match between P and D when replicated (region {region}: local={local}, remote={remote}, bsr={ratio}).")]
    /// Replicated (MLA) pages whose block lengths disagree after the ratio.
    ReplicatedBlockLen {
        /// The region (layer slot).
        region: usize,
        /// This engine's block length, in bytes.
        local: u64,
        /// The peer's block length, in bytes.
        remote: u64,
        /// The block-size ratio between the engines' kernel blocks.
        ratio: u32,
    },
    #[error("SPLIT region {region}: remote P KV block_len {remote} must equal {expected} (local {local}, heads {remote_heads}/{local_heads}, bsr {ratio}).")]
    /// A head-split region whose remote block length is not the local one
    /// scaled by heads and block-size ratio.
    SplitBlockLen {
        /// The region (layer slot).
        region: usize,
        /// This engine's block length, in bytes.
        local: u64,
        /// The peer's block length, in bytes.
        remote: u64,
        /// The block length the peer should have, in bytes.
        expected: u64,
        /// KV heads per prefill rank.
        remote_heads: u32,
        /// KV heads per decode rank.
        local_heads: u32,
        /// The block-size ratio between the engines' kernel blocks.
        ratio: u32,
    },
    #[error("Different local/remote block sizes are not supported when P TP > D TP.")]
    /// A block-size ratio together with reads from several prefill ranks.
    RatioWithMultiRead,
    #[error("remote ranks of one engine report different block counts ({first} vs {this})")]
    /// Two ranks of one remote engine report different block counts.
    NumBlocksMismatch {
        /// Kernel blocks the first rank reported.
        first: u64,
        /// Kernel blocks this rank reports.
        this: u64,
    },
    #[error(
        "remote region {region} has a block stride {stride} shorter than its block length {len}"
    )]
    /// A remote region whose blocks would overlap.
    StrideShorterThanLength {
        /// The region (layer slot).
        region: usize,
        /// Bytes between consecutive blocks.
        stride: u64,
        /// Bytes of one block.
        len: u64,
    },
    /// The per-source split lists cannot be built.
    #[error(transparent)]
    Split(#[from] SplitError),
    /// A pairing the connector does not implement, in words.
    #[error("{0}")]
    Unsupported(String),
    #[error(
        "NixlPushConnector requires identical P/D block sizes. Kernel block size and kernel \
         blocks per logical block: local ({}, {}), remote engine {engine} ({}, {}).",
        local.0, local.1, remote.0, remote.1
    )]
    /// A push pair whose block geometries differ, under a push protocol
    /// that accepts identical ones only.
    PushBlockSizes {
        /// This engine's (kernel block size, kernel blocks per logical block).
        local: (u32, u32),
        /// The peer engine's id.
        engine: String,
        /// The peer's (kernel block size, kernel blocks per logical block).
        remote: (u32, u32),
    },
}

/// What the checks need to know about the local side.
pub struct LocalSide<'a> {
    pub model: &'a ModelSpec,
    pub reg: &'a Registration,
    pub tp_size: u32,
    pub layout: KvLayout,
    pub host_buffer: bool,
    pub prefix_caching: bool,
    pub policy: Policy,
}

/// What the checks need to know about the remote rank.
pub struct RemoteSide<'a> {
    /// Its metadata as the checks see it.
    pub meta: &'a HandshakeMetadata,
    pub tp_size: u32,
    /// [`tp_ratio`] of the pair.
    pub tp_ratio: i32,
    /// [`kernel_ratio`] of the pair.
    pub kernel_ratio: u32,
    /// The block count the engine's first rank advertised.
    pub first_num_blocks: u64,
    /// The local rank gathers attention heads from several remote ranks.
    pub gathers_heads: bool,
}

/// The TP ratio (`local / remote`, negative `-(remote / local)` when the
/// remote engine is larger), or the refusal when neither divides the other.
pub fn tp_ratio(local: u32, remote: u32) -> Result<i32, HandshakeError> {
    crate::geometry::tp_ratio(local, remote).ok_or(HandshakeError::TpNotDivisible { local, remote })
}

/// Local kernel block / remote kernel block, or the refusal when the
/// remote block does not divide the local one.
pub fn kernel_ratio(local: u32, remote: u32) -> Result<u32, HandshakeError> {
    crate::geometry::block_size_ratio(local, remote)
        .ok_or(HandshakeError::BlockSizeNotDivisible { local, remote })
}

/// The push protocol's check of the peer's block geometry, run by either
/// side of a push pair before anything else of the handshake
/// ([`PushBlockSizes`]).
pub fn check_push_block_sizes(
    policy: &Policy,
    reg: &Registration,
    meta: &HandshakeMetadata,
) -> Result<(), HandshakeError> {
    let local = (reg.kernel_block, reg.ppl);
    let remote = (meta.block_size, meta.physical_blocks_per_logical_kv_block);
    if policy.push.block_sizes == PushBlockSizes::IdenticalOnly && local != remote {
        return Err(HandshakeError::PushBlockSizes {
            local,
            engine: meta.engine_id.clone(),
            remote,
        });
    }
    Ok(())
}

/// `_validate_remote_agent_handshake`: the checks after the ratios are known,
/// then kvgeom's check of gathered heads.
pub fn validate(local: &LocalSide<'_>, remote: &RemoteSide<'_>) -> Result<(), HandshakeError> {
    validate_as_vllm(local, remote)?;
    // A rank gathering several heads from different source ranks places
    // each source's page in a head slot: only head-major pages have them.
    // (vLLM 0.33.0 checks this only when the source ranks do not replicate
    // their heads.)
    if remote.gathers_heads
        && !local.model.is_mla()
        && !local.layout.is_block_contiguous()
        && local.policy.handshake.gathered_replicated_heads_nhd == Acceptance::Refuse
    {
        return Err(HandshakeError::HeadSplitNeedsContiguousLayout);
    }
    Ok(())
}

/// The checks of vLLM 0.33.0's `_validate_remote_agent_handshake`.
fn validate_as_vllm(local: &LocalSide<'_>, remote: &RemoteSide<'_>) -> Result<(), HandshakeError> {
    let meta = remote.meta;
    let remote_tp = remote.tp_size;
    let tp_ratio = remote.tp_ratio;
    let ratio = remote.kernel_ratio;
    let first_num_blocks = remote.first_num_blocks;
    let model = local.model;
    let is_mla = model.is_mla();
    let has_mamba = model.has_mamba();
    let total_heads = model.attention.as_ref().map_or(1, |a| a.total_kv_heads());
    let kv_replicated = remote_tp > total_heads;
    if !is_mla && !has_mamba && tp_ratio < 0 && kv_replicated {
        return Err(HandshakeError::ReplicatedKvMultiRead {
            remote_tp,
            total_heads,
        });
    }
    let remote_ppl = meta.physical_blocks_per_logical_kv_block;
    if has_mamba && remote_ppl != local.reg.ppl && local.prefix_caching {
        return Err(HandshakeError::PrefixCachingHeteroPpl {
            local: local.reg.ppl,
            remote: remote_ppl,
        });
    }
    if ratio != 1
        && local.host_buffer
        && local.policy.handshake.host_buffer_with_ratio == Acceptance::Refuse
    {
        return Err(HandshakeError::HostBufferWithRatio { ratio });
    }
    if !is_mla && meta.kv_cache_layout != local.layout {
        return Err(HandshakeError::LayoutMismatch {
            local: local.layout.vllm_name(),
            remote: meta.kv_cache_layout.vllm_name(),
        });
    }
    if tp_ratio.abs() != 1 && !is_mla && !kv_replicated && !local.layout.is_block_contiguous() {
        return Err(HandshakeError::HeadSplitNeedsContiguousLayout);
    }
    let local_lens = local.reg.block_lens();
    if has_mamba && is_mla {
        let scaled: Vec<u64> = meta
            .block_lens
            .iter()
            .map(|l| l * u64::from(ratio))
            .collect();
        if local_lens != scaled {
            return Err(HandshakeError::HybridMlaBlockLens {
                ratio,
                local: local_lens,
                remote: meta.block_lens.clone(),
            });
        }
    } else if !has_mamba {
        if local_lens.len() != meta.block_lens.len() {
            return Err(HandshakeError::RegionCount {
                local: local_lens.len(),
                remote: meta.block_lens.len(),
            });
        }
        let replicated_model = is_mla || kv_replicated;
        let attention = model.attention.as_ref();
        let local_heads = attention.map_or(1, |a| a.heads_per_rank(local.tp_size));
        let remote_heads = attention.map_or(1, |a| a.heads_per_rank(remote_tp));
        for (i, (&local_len, &remote_len)) in local_lens.iter().zip(&meta.block_lens).enumerate() {
            let r = u64::from(ratio);
            if replicated_model || local.reg.regions[i].replicated {
                if local_len / r != remote_len {
                    return Err(HandshakeError::ReplicatedBlockLen {
                        region: i,
                        local: local_len,
                        remote: remote_len,
                        ratio,
                    });
                }
            } else {
                let scaled = local_len * u64::from(remote_heads) / u64::from(local_heads);
                let expected = if tp_ratio > 0 {
                    scaled / r
                } else {
                    if ratio != 1 {
                        return Err(HandshakeError::RatioWithMultiRead);
                    }
                    scaled
                };
                if remote_len != expected {
                    return Err(HandshakeError::SplitBlockLen {
                        region: i,
                        local: local_len,
                        remote: remote_len,
                        expected,
                        remote_heads,
                        local_heads,
                        ratio,
                    });
                }
            }
        }
    }
    if first_num_blocks != meta.num_blocks {
        return Err(HandshakeError::NumBlocksMismatch {
            first: first_num_blocks,
            this: meta.num_blocks,
        });
    }
    if let Some(types) = &meta.region_mem_types {
        if types.windows(2).any(|w| w[0] != w[1]) {
            return Err(HandshakeError::MixedMemoryPeer {
                types: types.clone(),
            });
        }
    }
    if meta.kv_caches_base_addr.len() != local.reg.num_regions() {
        return Err(HandshakeError::RegionCount {
            local: local.reg.num_regions(),
            remote: meta.kv_caches_base_addr.len(),
        });
    }
    for (i, (&stride, &len)) in meta.block_strides.iter().zip(&meta.block_lens).enumerate() {
        if stride < len {
            return Err(HandshakeError::StrideShorterThanLength {
                region: i,
                stride,
                len,
            });
        }
    }
    Ok(())
}

/// vLLM 0.33.0 pairs a hybrid MLA remote whose kernel block does not divide
/// the local one by viewing the remote blocks as gcd-sized kernel blocks
/// (`_split_remote_blocks`, pull only). Returns the adjusted metadata.
pub fn split_remote_blocks(local_kernel: u32, meta: &HandshakeMetadata) -> HandshakeMetadata {
    const MAX_SPLIT: u32 = 128;
    let mut meta = meta.clone();
    if local_kernel % meta.block_size == 0 {
        return meta;
    }
    let unit = gcd(local_kernel, meta.block_size);
    let split = meta.block_size / unit;
    if split.max(local_kernel / unit) > MAX_SPLIT
        || meta.block_strides != meta.block_lens
        || meta.block_lens.iter().any(|l| l % u64::from(split) != 0)
    {
        return meta;
    }
    meta.block_size /= split;
    meta.physical_blocks_per_logical_kv_block *= split;
    meta.num_blocks *= u64::from(split);
    meta.block_lens = meta
        .block_lens
        .iter()
        .map(|l| l / u64::from(split))
        .collect();
    meta.block_strides = meta.block_lens.clone();
    meta
}

/// kvgeom's push from a prefill rank with a smaller kernel block: the
/// decode pages seen as `remote / local` prefill-sized sub-pages, which is
/// what the compatibility checks compare against. Returns the view and the
/// sub-page count.
pub fn view_as_sub_pages(
    local_kernel: u32,
    meta: &HandshakeMetadata,
) -> Result<(HandshakeMetadata, u32), HandshakeError> {
    if meta.block_size % local_kernel != 0 {
        return Err(HandshakeError::BlockSizeNotDivisible {
            local: local_kernel,
            remote: meta.block_size,
        });
    }
    let split = meta.block_size / local_kernel;
    if meta.block_lens.iter().any(|l| l % u64::from(split) != 0) {
        return Err(HandshakeError::Unsupported(format!(
            "decode pages of {:?} bytes do not split into {split} sub-pages",
            meta.block_lens
        )));
    }
    if let Some((region, (&stride, &len))) = meta
        .block_strides
        .iter()
        .zip(&meta.block_lens)
        .enumerate()
        .find(|(_, (s, l))| s < l)
    {
        return Err(HandshakeError::StrideShorterThanLength {
            region,
            stride,
            len,
        });
    }
    let mut view = meta.clone();
    view.block_size = local_kernel;
    view.physical_blocks_per_logical_kv_block *= split;
    view.num_blocks *= u64::from(split);
    view.block_lens = meta
        .block_lens
        .iter()
        .map(|l| l / u64::from(split))
        .collect();
    view.block_strides = view.block_lens.clone();
    Ok((view, split))
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}
