//! The model side of a geometry: attention and mamba layer specs, KV-cache
//! groups and the shared tensors ("layer slots") that overlay them.
//!
//! Byte sizes here are per TP rank unless a name says "total".

use serde::{Deserialize, Serialize};

/// Physical order of an attention page (vLLM's `kv_cache_layout`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub enum KvLayout {
    /// `LBNHC`: tokens outer, heads inner (formerly "NHD").
    #[serde(rename = "NHD", alias = "LBNHC")]
    Nhd,
    /// `LBHNC`: heads outer, tokens inner (formerly "HND"); block-contiguous heads.
    #[serde(rename = "HND", alias = "LBHNC")]
    Hnd,
}

impl KvLayout {
    /// vLLM's layout name.
    pub fn vllm_name(self) -> &'static str {
        match self {
            KvLayout::Nhd => "LBNHC",
            KvLayout::Hnd => "LBHNC",
        }
    }

    /// Heads are the outermost axis inside a block, so a head slice is contiguous.
    pub fn is_block_contiguous(self) -> bool {
        matches!(self, KvLayout::Hnd)
    }
}

/// Attention layers of the model (one attention KV-cache group).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum AttentionSpec {
    /// Multi-head latent attention: one latent per token, replicated on every TP
    /// rank and transferred as whole blocks.
    Mla {
        /// Elements of the latent per token.
        head_size: u32,
        /// Bytes per element.
        dtype_bytes: u32,
    },
    /// Full (GQA/MHA) attention: K and V packed in the content axis, heads
    /// sharded across TP ranks.
    Full {
        /// KV heads over all TP ranks.
        total_kv_heads: u32,
        /// Elements per head per token of K, and again of V.
        head_size: u32,
        /// Bytes per element.
        dtype_bytes: u32,
    },
}

impl AttentionSpec {
    /// Whether this is MLA.
    pub fn is_mla(&self) -> bool {
        matches!(self, AttentionSpec::Mla { .. })
    }

    /// Total KV heads as the TP mapping sees them (1 for MLA).
    pub fn total_kv_heads(&self) -> u32 {
        match self {
            AttentionSpec::Mla { .. } => 1,
            AttentionSpec::Full { total_kv_heads, .. } => *total_kv_heads,
        }
    }

    /// KV heads held by one rank at this TP size (at least one: replicated when TP > heads).
    pub fn heads_per_rank(&self, tp_size: u32) -> u32 {
        match self {
            AttentionSpec::Mla { .. } => 1,
            AttentionSpec::Full { total_kv_heads, .. } => (total_kv_heads / tp_size).max(1),
        }
    }

    /// Bytes of one head of one token (K and V together for full attention).
    pub fn bytes_per_head_token(&self) -> u64 {
        match self {
            AttentionSpec::Mla {
                head_size,
                dtype_bytes,
            } => u64::from(*head_size) * u64::from(*dtype_bytes),
            AttentionSpec::Full {
                head_size,
                dtype_bytes,
                ..
            } => 2 * u64::from(*head_size) * u64::from(*dtype_bytes),
        }
    }

    /// Bytes of one token on one rank at this TP size.
    pub fn bytes_per_token(&self, tp_size: u32) -> u64 {
        self.bytes_per_head_token() * u64::from(self.heads_per_rank(tp_size))
    }
}

/// The flavour of mamba-style state: decides how the conv state splits into
/// sub-projections.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub enum MambaKind {
    /// One conv sub-projection.
    Mamba1,
    /// Conv split into x | B | C.
    Mamba2,
    /// Gated delta net: conv split into Q | K | V.
    Gdn,
    /// Kimi delta attention: three separate conv tensors Q, K, V.
    Kda,
}

impl MambaKind {
    /// Conv sub-projections of one state: 1 for Mamba1, 3 otherwise.
    pub fn num_conv_projections(self) -> usize {
        match self {
            MambaKind::Mamba1 => 1,
            _ => 3,
        }
    }
}

/// Mamba-style state of one layer. Every dimension is the model total and is
/// sharded evenly across TP ranks, except Mamba2's B and C when `n_groups`
/// says they are replicated.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MambaSpec {
    /// Which mamba variant, which fixes how the conv state splits.
    pub kind: MambaKind,
    /// Channels of each conv sub-projection, summed over all TP ranks
    /// (one entry for Mamba1, three otherwise). With `n_groups`, B and C are
    /// the model's `n_groups x state size` channels, before any replication.
    pub conv_dims: Vec<u32>,
    /// Rows of conv state kept per channel (conv kernel width - 1).
    pub conv_rows: u32,
    /// Bytes per conv state element.
    pub conv_dtype_bytes: u32,
    /// Bytes of the temporal (SSM) state, summed over all TP ranks.
    pub ssm_state_bytes: u64,
    /// Mamba2 only: the model's B/C groups. At a TP size that does not
    /// divide them (vLLM then requires one group) every rank holds the whole
    /// group: B and C are replicated, not sharded. `None`: B and C are
    /// sharded at every TP size.
    #[serde(default)]
    pub n_groups: Option<u32>,
}

/// One conv sub-projection inside a mamba page: byte offset from the page start and size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SubRegion {
    /// Bytes from the page start.
    pub offset: u64,
    /// Bytes of the sub-projection.
    pub size: u64,
}

impl MambaSpec {
    /// Whether conv sub-projection `j` is replicated at `tp_size`: Mamba2's B
    /// and C when TP does not divide `n_groups` (vLLM's
    /// `extra_groups_for_head_shards`: each rank then holds whole groups).
    pub fn is_replicated(&self, j: usize, tp_size: u32) -> bool {
        self.kind == MambaKind::Mamba2 && j > 0 && self.n_groups.is_some_and(|g| g % tp_size != 0)
    }

    /// Channels of conv sub-projection `j` on one rank at `tp_size`.
    pub fn rank_channels(&self, j: usize, tp_size: u32) -> u32 {
        let dim = self.conv_dims[j];
        match self.n_groups {
            // n_groups + (tp - n_groups) groups over tp ranks: one group each.
            Some(groups) if self.is_replicated(j, tp_size) => dim / groups,
            _ => dim / tp_size,
        }
    }

    /// Channels of the full (all-rank) state before rank `tp_rank`'s slice
    /// of conv sub-projection `j` at `tp_size`: `tp_rank x` its width when
    /// sharded; for replicated groups, the first channel of the group the
    /// rank holds (rank `r` holds group `r x n_groups / tp`).
    pub fn rank_first_channel(&self, j: usize, tp_size: u32, tp_rank: u32) -> u64 {
        let width = u64::from(self.rank_channels(j, tp_size));
        match self.n_groups {
            Some(groups) if self.is_replicated(j, tp_size) => {
                u64::from(tp_rank) * u64::from(groups) / u64::from(tp_size) * width
            }
            _ => u64::from(tp_rank) * width,
        }
    }

    /// Bytes of one conv channel's state (its rows).
    pub fn channel_bytes(&self) -> u64 {
        u64::from(self.conv_rows) * u64::from(self.conv_dtype_bytes)
    }

    /// Bytes of each conv sub-projection on one rank.
    pub fn conv_projection_bytes(&self, tp_size: u32) -> Vec<u64> {
        (0..self.conv_dims.len())
            .map(|j| u64::from(self.rank_channels(j, tp_size)) * self.channel_bytes())
            .collect()
    }

    /// Byte of the full (all-rank) state of conv sub-projection `j` where
    /// rank `tp_rank`'s slice starts.
    pub fn conv_global_start(&self, j: usize, tp_size: u32, tp_rank: u32) -> u64 {
        self.rank_first_channel(j, tp_size, tp_rank) * self.channel_bytes()
    }

    /// Contiguous conv sub-projections of one rank's page, from offset 0.
    pub fn conv_offsets(&self, tp_size: u32) -> Vec<SubRegion> {
        let mut offset = 0;
        self.conv_projection_bytes(tp_size)
            .into_iter()
            .map(|size| {
                let sub = SubRegion { offset, size };
                offset += size;
                sub
            })
            .collect()
    }

    /// `(conv_size, ssm_size)` of one rank: vLLM's `ssm_sizes`.
    pub fn ssm_sizes(&self, tp_size: u32) -> (u64, u64) {
        let conv = self.conv_projection_bytes(tp_size).iter().sum();
        (conv, self.ssm_state_bytes / u64::from(tp_size))
    }

    /// Real state bytes of one rank (before padding to the page size).
    pub fn state_bytes(&self, tp_size: u32) -> u64 {
        let (conv, ssm) = self.ssm_sizes(tp_size);
        conv + ssm
    }

    /// Number of descriptor sub-regions per mamba region: conv projections + SSM state.
    pub fn num_sub_regions(&self) -> usize {
        self.conv_dims.len() + 1
    }
}

/// Kind of one KV-cache group.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub enum GroupKind {
    /// Attention KV, one entry per token.
    Attention,
    /// Mamba state, one padded page per request.
    Mamba,
}

/// The model: its layer specs, its KV-cache groups in transfer order, and the
/// number of layer slots. Under the hybrid allocator every group has one layer
/// per slot and all layers of a slot overlay one shared tensor (one NIXL region).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelSpec {
    /// The attention layers' spec, if the model has attention groups.
    pub attention: Option<AttentionSpec>,
    /// The mamba layers' spec, if the model has mamba groups.
    pub mamba: Option<MambaSpec>,
    /// KV-cache groups, in transfer order.
    pub groups: Vec<GroupKind>,
    /// Shared tensors (layer slots); each is one region.
    pub layer_slots: u32,
    /// Layer slots holding a mamba layer, when fewer than `layer_slots`:
    /// slots `0..n` hold one, the others attention layers only (a partly
    /// filled group). `None`: every slot holds a layer of each kind.
    pub state_slots: Option<u32>,
}

impl ModelSpec {
    /// Whether any group holds mamba state.
    pub fn has_mamba(&self) -> bool {
        self.groups.contains(&GroupKind::Mamba)
    }

    /// Whether the attention is MLA.
    pub fn is_mla(&self) -> bool {
        self.attention.as_ref().is_some_and(AttentionSpec::is_mla)
    }

    /// Layer slots holding mamba state (vLLM's `_ssm_region_indices`):
    /// slots `0..n`; 0 without mamba.
    pub fn state_slot_count(&self) -> u32 {
        if self.has_mamba() {
            self.state_slots.unwrap_or(self.layer_slots)
        } else {
            0
        }
    }

    /// Index of the first group of `kind`, if any.
    pub fn first_group(&self, kind: GroupKind) -> Option<usize> {
        self.groups.iter().position(|g| *g == kind)
    }
}
