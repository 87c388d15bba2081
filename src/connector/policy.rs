//! The connector's decision points. Every behaviour of the connector that
//! has had more than one answer in vLLM's history is one field here, named
//! for the decision, not for a bug. `Policy::default()` is kvgeom's
//! connector; [`Policy::vllm_0_33_0`] and [`Policy::vllm_0_34_0`] are those
//! vLLM releases as released.

use serde::Serialize;

/// How decode's and prefill's block lists are lined up after a prefix hit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PrefixAlignment {
    /// Both lists start at the first token the transfer moves (kvgeom).
    #[default]
    FromFirstToken,
    /// Prefill's list is end-aligned to decode's (vLLM 0.33.0's
    /// `_apply_prefix_caching`): right only when both lists end together.
    EndTrim,
    /// Pull across different kernel or logical block sizes pairs the lists
    /// from the transfer's last token (vLLM 0.34.0's
    /// `_pair_blocks_by_last_token`): each side's sub-blocks past the
    /// prefill's token count (`remote_num_tokens`, which the request must
    /// carry, else the read is declined) are dropped and the lists are
    /// paired from their ends; the receive zeroing clears what lies outside
    /// the covered range at both ends. Right only when decode's list ends in
    /// the block of prefill's last token. Equal block sizes and push
    /// end-trim as [`PrefixAlignment::EndTrim`].
    LastTokenWhenSizesDiffer,
}

/// How the receive post-process zeroes what the transfer did not write.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReceiveZeroing {
    /// One rule for every regime: the token tail of the last partially
    /// covered block, then every whole block after it.
    #[default]
    Unified,
    /// Zeroing runs only with a kernel-block ratio; a ppl mismatch with equal
    /// kernel pages zeroes nothing.
    RatioOnly,
    /// The older split rule: a ratio tail path (non-MLA, last block only)
    /// plus whole kernel blocks counted in local units for a ppl mismatch.
    TwoPath,
    /// The block ids never reach the post-process: nothing is zeroed.
    Skipped,
    /// [`ReceiveZeroing::Unified`] with the whole-block range run through an
    /// inclusive end: the kernel block after the request's last one is
    /// zeroed too.
    InclusiveEnd,
}

/// How far decode's and prefill's kernel-block counts may differ before the
/// alignment refuses the request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PrefixCountTolerance {
    /// Up to the sum of both ppl (dead blocks on each side plus the
    /// recomputed last token's block).
    #[default]
    SumOfPpl,
    /// Strictly less than the larger ppl.
    StrictMaxPpl,
}

/// What identifies a set of per-source split lists (multi-read).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SplitListKey {
    /// The TP ratio and the remote kernel block; lists are built at the
    /// remote granularity.
    #[default]
    RatioAndRemoteBlock,
    /// The TP ratio alone; lists are built at the local granularity.
    RatioOnly,
}

/// Where a per-source split list (multi-read) places its source rank's
/// share of head-sharded attention inside the local page.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SplitHeadSlot {
    /// At the slot of the source rank's heads.
    #[default]
    BySourceRank,
    /// Every source rank's share at the first slot.
    First,
}

/// How the addresses of a kernel block's sub-blocks are computed when the
/// block is split for a smaller remote kernel.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SubBlockAddressing {
    /// From each block's own base: sub-blocks abut inside a (possibly
    /// padded) block.
    #[default]
    WithinBlock,
    /// One run of `index x stride / ratio`: right only when the block stride
    /// equals its length.
    StrideOverRatio,
}

/// Whether padded kernel pages (`block_padding_bytes`) can be registered
/// when several layer slots share the engine's one backing allocation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PaddedPageRegistration {
    /// Each slot's region is registered with its padded block stride.
    #[default]
    Strided,
    /// vLLM 0.33.0: a view whose bytes are not whole runs of padded blocks
    /// is refused unless it is the only layer of its allocation.
    RefusedWhenShared,
}

/// Which ppl expands the remote engine's logical ids to kernel ids.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RemoteIdExpansion {
    /// The remote engine's own ppl.
    #[default]
    RemotePpl,
    /// The local engine's ppl.
    LocalPpl,
}

/// How mamba state descriptors and their ids follow a kernel-block ratio.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum MambaExpansion {
    /// State pages keep the local page geometry, one per logical block.
    #[default]
    OnePerLogicalBlock,
    /// State descriptors and ids expanded by the ratio like attention.
    RatioExpanded,
}

/// How the conv state's sub-projections (x | B | C, Q | K | V) are located
/// in the peer's page when the engines' TP sizes differ.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ConvSplit {
    /// From both engines' own widths: replicated Mamba2 groups are moved
    /// once, whole, into every decode rank that holds them.
    #[default]
    PeerWidths,
    /// The local widths scaled by the TP ratio (vLLM 0.33.0's
    /// `remote_conv_offsets`): right only when every sub-projection is
    /// sharded on both engines.
    LocalWidthsScaled,
}

/// Whether a handshake check refuses or accepts a combination.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Acceptance {
    #[default]
    Refuse,
    Accept,
}

/// Handshake checks that have been stricter or looser over time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
pub struct HandshakeStrictness {
    /// Host-buffer (staging) mode with a kernel-block ratio.
    pub host_buffer_with_ratio: Acceptance,
    /// Token-major (NHD) pages when a rank gathers heads from prefill ranks
    /// that replicate them.
    pub gathered_replicated_heads_nhd: Acceptance,
}

/// How decode takes part in a push handshake.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DecodePushHandshake {
    /// Decode validates the pair as a pull would, and a prefill rank that
    /// refuses tells decode why.
    #[default]
    Validated,
    /// Decode only records the prefill engine (its remote block list stays
    /// empty); a refusing prefill rank only logs.
    RecordOnly,
}

/// What a push completion notification tells decode.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PushCompletionReport {
    /// The request and the sub-blocks written per attention group.
    #[default]
    CoveredCounts,
    /// The request only.
    RequestOnly,
}

/// In which direction the two push sides compute the kernel-block ratio.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PushRatioDirection {
    /// Either kernel may be larger: prefill writes into decode sub-pages
    /// when decode's kernel is larger.
    #[default]
    BothDirections,
    /// Each side divides its own kernel by the other's, so the sides disagree.
    LocalOverRemote,
}

/// Which prefill ranks write attention pages that several of them hold.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReplicatedPageWriters {
    /// One prefill rank per decode rank.
    #[default]
    OnePerDecodeRank,
    /// Every prefill rank holding a replica.
    EveryHolder,
}

/// Which block geometries a push handshake accepts between P and D.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PushBlockSizes {
    /// Any pair the pull checks accept (kernel and logical blocks may differ).
    #[default]
    AsPull,
    /// Kernel block size and kernel blocks per logical block must be equal
    /// on both sides; any difference is refused at the handshake, on either
    /// side that runs it (vLLM 0.34.0's push worker).
    IdenticalOnly,
}

/// The push (P writes into D) protocol.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
pub struct PushProtocol {
    pub decode_handshake: DecodePushHandshake,
    pub completion_report: PushCompletionReport,
    pub ratio_direction: PushRatioDirection,
    pub replicated_pages: ReplicatedPageWriters,
    pub block_sizes: PushBlockSizes,
}

impl PushProtocol {
    /// vLLM 0.33.0's push worker.
    pub const VLLM_0_33_0: PushProtocol = PushProtocol {
        decode_handshake: DecodePushHandshake::RecordOnly,
        completion_report: PushCompletionReport::RequestOnly,
        ratio_direction: PushRatioDirection::LocalOverRemote,
        replicated_pages: ReplicatedPageWriters::EveryHolder,
        block_sizes: PushBlockSizes::AsPull,
    };

    /// vLLM 0.34.0's push worker: 0.33.0's, behind a handshake that refuses
    /// any difference in block geometry.
    pub const VLLM_0_34_0: PushProtocol = PushProtocol {
        block_sizes: PushBlockSizes::IdenticalOnly,
        ..PushProtocol::VLLM_0_33_0
    };
}

/// Every decision point of the connector.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
pub struct Policy {
    /// Where the request's first transferred token sits in both lists.
    pub prefix_alignment: PrefixAlignment,
    /// Which stale and clipped bytes the receive post-process zeroes.
    pub receive_zeroing: ReceiveZeroing,
    /// How far the prefix-cache block counts of P and D may disagree.
    pub prefix_count_tolerance: PrefixCountTolerance,
    /// What per-source split lists are keyed by and at which granularity.
    pub split_list_key: SplitListKey,
    /// Where each source rank's head share lands in a multi-read.
    pub split_head_slot: SplitHeadSlot,
    /// How sub-block addresses are computed when kernel blocks are split.
    pub sub_block_addressing: SubBlockAddressing,
    /// Which ppl expands remote logical ids to kernel ids.
    pub remote_id_expansion: RemoteIdExpansion,
    /// Whether mamba state descriptors follow the block-size ratio.
    pub mamba_expansion: MambaExpansion,
    /// Where each conv sub-projection lies in the peer's page.
    pub conv_split: ConvSplit,
    /// The push (WRITE) protocol: handshake, completion, ratio, replicated pages.
    pub push: PushProtocol,
    /// Which pairings the handshake refuses.
    pub handshake: HandshakeStrictness,
    /// Whether padded pages of a shared allocation can be registered.
    pub padded_pages: PaddedPageRegistration,
}

impl Policy {
    /// vLLM 0.33.0 as released: end-trim prefix alignment, its push
    /// protocol, NHD pages accepted when gathering replicated heads, and
    /// conv offsets scaled from the local widths.
    pub fn vllm_0_33_0() -> Policy {
        Policy {
            prefix_alignment: PrefixAlignment::EndTrim,
            conv_split: ConvSplit::LocalWidthsScaled,
            push: PushProtocol::VLLM_0_33_0,
            handshake: HandshakeStrictness {
                gathered_replicated_heads_nhd: Acceptance::Accept,
                ..HandshakeStrictness::default()
            },
            padded_pages: PaddedPageRegistration::RefusedWhenShared,
            ..Policy::default()
        }
    }

    /// vLLM 0.34.0 as released: 0.33.0 with pull across different block
    /// sizes paired from the last token (and declined without the prefill's
    /// token count), and push refusing any difference in block geometry at
    /// the handshake. Its other changes (region pairing by the layers both
    /// sides hold, regions keyed by base address and block length, DCP
    /// rules) are no decision here: on every layout kvgeom registers, the
    /// regions are distinct tensors holding the same layers on both sides,
    /// and kvgeom models no DCP.
    pub fn vllm_0_34_0() -> Policy {
        Policy {
            prefix_alignment: PrefixAlignment::LastTokenWhenSizesDiffer,
            push: PushProtocol::VLLM_0_34_0,
            ..Policy::vllm_0_33_0()
        }
    }
}

/// A policy with a name: the ones the command line offers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
pub enum NamedPolicy {
    /// kvgeom's connector (`Policy::default()`).
    #[default]
    #[serde(rename = "kvgeom")]
    Kvgeom,
    /// vLLM 0.33.0 as released, its known bugs included.
    #[serde(rename = "vllm-0.33.0")]
    Vllm0330,
    /// vLLM 0.34.0 as released, its known bugs included.
    #[serde(rename = "vllm-0.34.0")]
    Vllm0340,
}

impl NamedPolicy {
    /// Every named policy.
    pub const ALL: [NamedPolicy; 3] = [
        NamedPolicy::Kvgeom,
        NamedPolicy::Vllm0330,
        NamedPolicy::Vllm0340,
    ];

    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            NamedPolicy::Kvgeom => "kvgeom",
            NamedPolicy::Vllm0330 => "vllm-0.33.0",
            NamedPolicy::Vllm0340 => "vllm-0.34.0",
        }
    }

    /// The policy of a command-line name.
    pub fn from_name(name: &str) -> Option<NamedPolicy> {
        NamedPolicy::ALL.into_iter().find(|p| p.name() == name)
    }

    /// The decisions it stands for.
    pub fn policy(self) -> Policy {
        match self {
            NamedPolicy::Kvgeom => Policy::default(),
            NamedPolicy::Vllm0330 => Policy::vllm_0_33_0(),
            NamedPolicy::Vllm0340 => Policy::vllm_0_34_0(),
        }
    }
}

impl std::fmt::Display for NamedPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_policies_round_trip_and_differ() {
        for p in NamedPolicy::ALL {
            assert_eq!(NamedPolicy::from_name(p.name()), Some(p));
        }
        assert_eq!(NamedPolicy::from_name("vllm"), None);
        assert_ne!(Policy::vllm_0_33_0(), Policy::default());
        assert_ne!(Policy::vllm_0_34_0(), Policy::vllm_0_33_0());
        assert_eq!(NamedPolicy::Kvgeom.policy(), Policy::default());
    }
}
