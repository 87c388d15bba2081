//! Known historical connector defects, as switchable variants of the
//! connector ("mutants"). The default sweep must catch every one of them:
//! an oracle that no real bug can fail is not trusted.

use serde::Serialize;

/// One real defect of vLLM's NIXL connector in the heterogeneous-geometry code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub enum Defect {
    StrictPrefixTolerance,
    NoClippedBlockZeroing,
    TwoPathZeroing,
    DiscardedBlockIds,
    PaddedSubblockAddress,
    RemoteIdsLocalPpl,
    MambaRatioExpanded,
    HostBufferRatioAccepted,
    SplitHandleKeyRatioOnly,
    PushEmptyRemoteIds,
    PushOneWayRatio,
    PushReplicatedDoubleWrite,
    EndTrimAlignment,
    ReplicatedHeadsNhdAccepted,
}

impl Defect {
    pub const ALL: [Defect; 14] = [
        Defect::StrictPrefixTolerance,
        Defect::NoClippedBlockZeroing,
        Defect::TwoPathZeroing,
        Defect::DiscardedBlockIds,
        Defect::PaddedSubblockAddress,
        Defect::RemoteIdsLocalPpl,
        Defect::MambaRatioExpanded,
        Defect::HostBufferRatioAccepted,
        Defect::SplitHandleKeyRatioOnly,
        Defect::PushEmptyRemoteIds,
        Defect::PushOneWayRatio,
        Defect::PushReplicatedDoubleWrite,
        Defect::EndTrimAlignment,
        Defect::ReplicatedHeadsNhdAccepted,
    ];

    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Defect::StrictPrefixTolerance => "strict-prefix-tolerance",
            Defect::NoClippedBlockZeroing => "no-clipped-block-zeroing",
            Defect::TwoPathZeroing => "two-path-zeroing",
            Defect::DiscardedBlockIds => "discarded-block-ids",
            Defect::PaddedSubblockAddress => "padded-subblock-address",
            Defect::RemoteIdsLocalPpl => "remote-ids-local-ppl",
            Defect::MambaRatioExpanded => "mamba-ratio-expanded",
            Defect::HostBufferRatioAccepted => "host-buffer-ratio-accepted",
            Defect::SplitHandleKeyRatioOnly => "split-handle-key-ratio-only",
            Defect::PushEmptyRemoteIds => "push-empty-remote-ids",
            Defect::PushOneWayRatio => "push-one-way-ratio",
            Defect::PushReplicatedDoubleWrite => "push-replicated-double-write",
            Defect::EndTrimAlignment => "end-trim-alignment",
            Defect::ReplicatedHeadsNhdAccepted => "replicated-heads-nhd-accepted",
        }
    }

    pub fn from_name(name: &str) -> Option<Defect> {
        Defect::ALL.into_iter().find(|d| d.name() == name)
    }

    /// What the bug was.
    pub fn description(self) -> &'static str {
        match self {
            Defect::StrictPrefixTolerance => {
                "prefix-cache count check uses max(local ppl, remote ppl) as a strict bound"
            }
            Defect::NoClippedBlockZeroing => {
                "with equal kernel pages but different logical blocks, the clipped tail is never zeroed"
            }
            Defect::TwoPathZeroing => {
                "older split zeroing: ratio tail path (non-MLA, last block only) plus a whole-kernel-block path for ppl mismatch"
            }
            Defect::DiscardedBlockIds => {
                "block ids for the post-process are computed but not passed on, so nothing is zeroed"
            }
            Defect::PaddedSubblockAddress => {
                "sub-block addresses computed as index x stride / ratio, right only when stride equals length"
            }
            Defect::RemoteIdsLocalPpl => {
                "remote logical ids expanded to kernel ids with the local ppl instead of the remote one"
            }
            Defect::MambaRatioExpanded => {
                "mamba state descriptors and desc ids expanded by the block-size ratio like attention"
            }
            Defect::HostBufferRatioAccepted => {
                "handshake accepts host-buffer mode with a block-size ratio"
            }
            Defect::SplitHandleKeyRatioOnly => {
                "per-source split lists keyed by tp_ratio alone and built at local granularity"
            }
            Defect::PushEmptyRemoteIds => {
                "vLLM 0.33.0 push: D keeps an empty remote block list and fails on completion when ppl differs"
            }
            Defect::PushOneWayRatio => {
                "vLLM 0.33.0 push: P and D compute the block-size ratio in opposite directions"
            }
            Defect::PushReplicatedDoubleWrite => {
                "vLLM 0.33.0 push with P_TP > D_TP: every prefill rank writes the replicated MLA pages"
            }
            Defect::ReplicatedHeadsNhdAccepted => {
                "vLLM 0.33.0's handshake accepts token-major (NHD) pages when a rank gathers heads from prefill ranks that replicate them"
            }
            Defect::EndTrimAlignment => {
                "vLLM 0.33.0's prefix alignment end-aligns P's list to D's, wrong when P's list does not end where D's does"
            }
        }
    }

    /// The real-world symptom it caused.
    pub fn symptom(self) -> &'static str {
        match self {
            Defect::StrictPrefixTolerance => {
                "legitimate transfers refused (AssertionError), e.g. 12- vs 8-token blocks at N=25"
            }
            Defect::NoClippedBlockZeroing => "stale tail bytes surfacing as garbage mid-response",
            Defect::TwoPathZeroing => {
                "stale kernel blocks when both regimes meet (11 of 16 mixed-regime lengths)"
            }
            Defect::DiscardedBlockIds => "every clipped block keeps stale bytes",
            Defect::PaddedSubblockAddress => {
                "sub-blocks written outside the layer's page on interleaved layouts"
            }
            Defect::RemoteIdsLocalPpl => {
                "reads from the wrong prefill blocks (Qwen3.5 4P2D bug class)"
            }
            Defect::MambaRatioExpanded => "mamba state read from and written to wrong sub-regions",
            Defect::HostBufferRatioAccepted => {
                "host staging copies at the wrong granularity, corrupting KV"
            }
            Defect::SplitHandleKeyRatioOnly => {
                "multi-read transfers use descriptors of the wrong granularity"
            }
            Defect::PushEmptyRemoteIds => "decode crashes with IndexError; request never finishes",
            Defect::PushOneWayRatio => {
                "assertion on one side, decode waits forever for a push that never comes"
            }
            Defect::PushReplicatedDoubleWrite => {
                "the same decode bytes written by several concurrent WRITEs (NIXL does not detect it)"
            }
            Defect::ReplicatedHeadsNhdAccepted => {
                "each prefill page lands in a byte slot, not a head slot: tokens and heads scrambled"
            }
            Defect::EndTrimAlignment => {
                "D receives the wrong tokens after a prefix hit with the last-token block, or with different logical blocks on a model without mamba (silent corruption); a longer D list is refused"
            }
        }
    }
}

impl std::fmt::Display for Defect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
