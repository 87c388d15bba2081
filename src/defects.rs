//! Known connector defects: one table of (name, what the bug was, its
//! symptom, the policy decision it selects). A defect variant is
//! `Policy::default()` with that one decision changed; the default sweep
//! must catch every one of them (an oracle that no real bug can fail is not
//! trusted). The connector itself knows no defect, only its [`Policy`].

use serde::Serialize;

use crate::connector::policy::{
    Acceptance, ConvSplit, DecodePushHandshake, MambaExpansion, PaddedPageRegistration, Policy,
    PrefixAlignment, PrefixCountTolerance, PushBlockSizes, PushCompletionReport,
    PushRatioDirection, ReceiveZeroing, RemoteIdExpansion, ReplicatedPageWriters, SplitHeadSlot,
    SplitListKey, SubBlockAddressing,
};

/// One real defect of vLLM's NIXL connector in the heterogeneous-geometry code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
///
/// Each variant's `bug` and `symptom` are in its [`DefectInfo`] row
/// ([`Defect::info`]); the policy it selects is [`Defect::policy`].
pub enum Defect {
    /// The prefix-cache count check bounds by `max(local ppl, remote ppl)`.
    StrictPrefixTolerance,
    /// The clipped tail of a block is never zeroed (equal kernel pages,
    /// different logical blocks).
    NoClippedBlockZeroing,
    /// The older split zeroing: a ratio tail path and a whole-kernel-block path.
    TwoPathZeroing,
    /// The post-process's block ids are computed but dropped: nothing is zeroed.
    DiscardedBlockIds,
    /// Sub-block addresses as `index x stride / ratio`.
    PaddedSubblockAddress,
    /// Remote logical ids expanded with the local ppl instead of the remote one.
    RemoteIdsLocalPpl,
    /// Mamba state descriptors expanded by the block-size ratio like attention.
    MambaRatioExpanded,
    /// The handshake accepts host-buffer mode with a block-size ratio.
    HostBufferRatioAccepted,
    /// Split lists keyed by the TP ratio alone and built at local granularity.
    SplitHandleKeyRatioOnly,
    /// vLLM 0.33.0 push: D keeps an empty remote block list.
    PushEmptyRemoteIds,
    /// vLLM 0.33.0 push: P and D compute the block-size ratio in opposite directions.
    PushOneWayRatio,
    /// vLLM 0.33.0 push with `P_TP > D_TP`: every prefill rank writes the
    /// replicated MLA pages.
    PushReplicatedDoubleWrite,
    /// A multi-read (`P_TP > D_TP`, head-sharded attention) places every
    /// source rank's heads at the first head slot of the local page.
    SplitHeadSlotIgnored,
    /// vLLM 0.33.0's prefix alignment: P's list end-aligned to D's.
    EndTrimAlignment,
    /// vLLM 0.33.0's handshake accepts NHD pages when heads are gathered from
    /// prefill ranks that replicate them.
    ReplicatedHeadsNhdAccepted,
    /// The post-process zeroes through an inclusive end, one kernel block
    /// past the request's last.
    ZeroingOnePastEnd,
    /// vLLM 0.33.0 locates the peer's conv sub-projections from the local
    /// widths scaled by the TP ratio, which replicated Mamba2 groups break.
    ConvOffsetsScaled,
    /// vLLM 0.33.0 refuses padded kernel pages at registration when more
    /// than one layer slot shares the backing allocation.
    PaddedPagesRefusedWhenShared,
    /// vLLM 0.34.0 pairs a pull across different block sizes from the last
    /// token, right only when decode's list ends in that token's block.
    LastTokenPairing,
    /// vLLM 0.34.0's push refuses any P/D difference in block geometry.
    PushIdenticalBlockSizesOnly,
}

/// What a defect does to a request's KV.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Effect {
    /// Wrong or missing bytes, a crash, a hang or a wrong refusal: the
    /// sweep must fail a case.
    Corrupts,
    /// The right bytes at a cost (the same bytes written again): every case
    /// is judged right and some carry redundant writes.
    Costs,
}

/// One row of the defect table.
#[derive(Clone, Copy, Debug)]
pub struct DefectInfo {
    /// The defect this row describes.
    pub defect: Defect,
    /// The name used on the command line.
    pub name: &'static str,
    /// A few words naming the defect in reports.
    pub title: &'static str,
    /// What the bug was.
    pub bug: &'static str,
    /// The real-world symptom it caused.
    pub symptom: &'static str,
    /// Whether it corrupts or only costs.
    pub effect: Effect,
    /// The vLLM releases that have it as released: those whose plans, on
    /// the cases of `geometries/*.toml` that expose it, equal kvgeom's plan
    /// with the defect's decision and never the plan without it (`kvgeom
    /// matrix`'s `has`; [`MATRIX_FIXTURE`] holds the run this table is
    /// checked against). `0.33.0`, `0.34.0`: the policy that models that
    /// release is exactly its defects (of both lists).
    pub in_vllm: &'static [&'static str],
    /// The vLLM releases that have it by a reading of their wheel's
    /// connector (`vllm/distributed/kv_transfer/kv_connector/v1/nixl/`)
    /// where the committed matrix cannot tell: no case of `geometries/`
    /// reaches the code (0.34.0's `push-one-way-ratio`, behind push's
    /// refusal of any block-size difference: `not exposed`).
    pub read_in_vllm: &'static [&'static str],
    /// The decision it changes in `Policy::default()`.
    pub select: fn(&mut Policy),
}

/// The committed `kvgeom matrix` report (vLLM 0.30.0-0.34.0 over
/// `geometries/*.toml`) that each row's `in_vllm` must equal (relative to
/// the project root; docs/compatibility.md has its command).
pub const MATRIX_FIXTURE: &str = "tests/fixtures/matrix/vllm-0.30.0-0.34.0.json";

/// The committed `kvgeom matrix` report of the same releases over the
/// real-scale pairs of `geometries/models/` at their boundary prompts:
/// where it calls a defect `has` or `lacks`, `in_vllm` must agree (fewer
/// defects are exposed there; docs/compatibility.md has its command).
pub const MODELS_MATRIX_FIXTURE: &str = "tests/fixtures/matrix/vllm-0.30.0-0.33.0-models.json";

/// Every known defect, in the order `kvgeom defects` lists them.
pub static DEFECTS: [DefectInfo; 20] = [
    DefectInfo {
        defect: Defect::StrictPrefixTolerance,
        name: "strict-prefix-tolerance",
        title: "strict prefix-cache count bound",
        bug: "prefix-cache count check uses max(local ppl, remote ppl) as a strict bound",
        symptom: "legitimate transfers refused (AssertionError), e.g. 12- vs 8-token blocks at N=25",
        effect: Effect::Corrupts,
        in_vllm: &[],
        read_in_vllm: &[],
        select: |p| p.prefix_count_tolerance = PrefixCountTolerance::StrictMaxPpl,
    },
    DefectInfo {
        defect: Defect::NoClippedBlockZeroing,
        name: "no-clipped-block-zeroing",
        title: "clipped block tail never zeroed",
        bug: "with equal kernel pages but different logical blocks, the clipped tail is never zeroed",
        symptom: "stale tail bytes surfacing as garbage mid-response",
        effect: Effect::Corrupts,
        in_vllm: &[],
        read_in_vllm: &[],
        select: |p| p.receive_zeroing = ReceiveZeroing::RatioOnly,
    },
    DefectInfo {
        defect: Defect::TwoPathZeroing,
        name: "two-path-zeroing",
        title: "older two-path receive zeroing",
        bug: "older split zeroing: ratio tail path (non-MLA, last block only) plus a whole-kernel-block path for ppl mismatch",
        symptom: "stale kernel blocks when both regimes meet (11 of 16 mixed-regime lengths)",
        effect: Effect::Corrupts,
        in_vllm: &[],
        read_in_vllm: &[],
        select: |p| p.receive_zeroing = ReceiveZeroing::TwoPath,
    },
    DefectInfo {
        defect: Defect::DiscardedBlockIds,
        name: "discarded-block-ids",
        title: "post-process block ids dropped",
        bug: "block ids for the post-process are computed but not passed on, so nothing is zeroed",
        symptom: "every clipped block keeps stale bytes",
        effect: Effect::Corrupts,
        in_vllm: &[],
        read_in_vllm: &[],
        select: |p| p.receive_zeroing = ReceiveZeroing::Skipped,
    },
    DefectInfo {
        defect: Defect::PaddedSubblockAddress,
        name: "padded-subblock-address",
        title: "sub-block addresses as index x stride / ratio",
        bug: "sub-block addresses computed as index x stride / ratio, right only when stride equals length",
        symptom: "sub-blocks written outside the layer's page on interleaved layouts",
        effect: Effect::Corrupts,
        in_vllm: &[],
        read_in_vllm: &[],
        select: |p| p.sub_block_addressing = SubBlockAddressing::StrideOverRatio,
    },
    DefectInfo {
        defect: Defect::RemoteIdsLocalPpl,
        name: "remote-ids-local-ppl",
        title: "remote ids expanded with the local ppl",
        bug: "remote logical ids expanded to kernel ids with the local ppl instead of the remote one",
        symptom: "reads from the wrong prefill blocks (Qwen3.5 4P2D bug class)",
        effect: Effect::Corrupts,
        in_vllm: &[],
        read_in_vllm: &[],
        select: |p| p.remote_id_expansion = RemoteIdExpansion::LocalPpl,
    },
    DefectInfo {
        defect: Defect::MambaRatioExpanded,
        name: "mamba-ratio-expanded",
        title: "mamba state expanded by the block-size ratio",
        bug: "mamba state descriptors and desc ids expanded by the block-size ratio like attention",
        symptom: "mamba state read from and written to wrong sub-regions",
        effect: Effect::Corrupts,
        in_vllm: &[],
        read_in_vllm: &[],
        select: |p| p.mamba_expansion = MambaExpansion::RatioExpanded,
    },
    DefectInfo {
        defect: Defect::HostBufferRatioAccepted,
        name: "host-buffer-ratio-accepted",
        title: "host-buffer mode accepted with a block-size ratio",
        bug: "handshake accepts host-buffer mode with a block-size ratio",
        symptom: "host staging copies at the wrong granularity, corrupting KV",
        effect: Effect::Corrupts,
        in_vllm: &[],
        read_in_vllm: &[],
        select: |p| p.handshake.host_buffer_with_ratio = Acceptance::Accept,
    },
    DefectInfo {
        defect: Defect::SplitHandleKeyRatioOnly,
        name: "split-handle-key-ratio-only",
        title: "split lists keyed by the TP ratio alone",
        bug: "per-source split lists keyed by tp_ratio alone and built at local granularity",
        symptom: "multi-read transfers use descriptors of the wrong granularity",
        effect: Effect::Corrupts,
        in_vllm: &[],
        read_in_vllm: &[],
        select: |p| p.split_list_key = SplitListKey::RatioOnly,
    },
    DefectInfo {
        defect: Defect::PushEmptyRemoteIds,
        name: "push-empty-remote-ids",
        title: "vLLM 0.33.0 push: empty remote block list on decode",
        bug: "vLLM 0.33.0 push: D keeps an empty remote block list and fails on completion when ppl differs",
        symptom: "decode crashes with IndexError; request never finishes",
        effect: Effect::Corrupts,
        in_vllm: &["0.30.0", "0.31.0", "0.32.0", "0.33.0", "0.34.0"],
        read_in_vllm: &[],
        select: |p| {
            p.push.decode_handshake = DecodePushHandshake::RecordOnly;
            p.push.completion_report = PushCompletionReport::RequestOnly;
        },
    },
    DefectInfo {
        defect: Defect::PushOneWayRatio,
        name: "push-one-way-ratio",
        title: "vLLM 0.33.0 push: one-way block-size ratio",
        bug: "vLLM 0.33.0 push: P and D compute the block-size ratio in opposite directions",
        symptom: "assertion on one side, decode waits forever for a push that never comes",
        effect: Effect::Corrupts,
        in_vllm: &["0.30.0", "0.31.0", "0.32.0", "0.33.0"],
        read_in_vllm: &["0.34.0"],
        select: |p| {
            p.push.decode_handshake = DecodePushHandshake::RecordOnly;
            p.push.ratio_direction = PushRatioDirection::LocalOverRemote;
        },
    },
    DefectInfo {
        defect: Defect::PushReplicatedDoubleWrite,
        name: "push-replicated-double-write",
        title: "vLLM 0.33.0 push: replicated pages written by every prefill rank",
        bug: "vLLM 0.33.0 push with P_TP > D_TP: every prefill rank writes the replicated MLA pages",
        symptom: "the same decode bytes written by several concurrent WRITEs (NIXL does not detect it)",
        effect: Effect::Costs,
        in_vllm: &["0.30.0", "0.31.0", "0.32.0", "0.33.0", "0.34.0"],
        read_in_vllm: &[],
        select: |p| p.push.replicated_pages = ReplicatedPageWriters::EveryHolder,
    },
    DefectInfo {
        defect: Defect::SplitHeadSlotIgnored,
        name: "split-head-slot-ignored",
        title: "multi-read heads all written to the first head slot",
        bug: "P_TP > D_TP with head-sharded attention: each per-source split list places its rank's heads at the first head slot of decode's page instead of that rank's",
        symptom: "several prefill ranks write different heads into the same decode bytes; the other head slots are never written (silent corruption)",
        effect: Effect::Corrupts,
        in_vllm: &[],
        read_in_vllm: &[],
        select: |p| p.split_head_slot = SplitHeadSlot::First,
    },
    DefectInfo {
        defect: Defect::EndTrimAlignment,
        name: "end-trim-alignment",
        title: "vLLM 0.33.0 end-trim alignment",
        bug: "vLLM 0.33.0's prefix alignment end-aligns P's list to D's, wrong when P's list does not end where D's does",
        symptom: "D receives the wrong tokens after a prefix hit with the last-token block, or with different logical blocks on a model without mamba (silent corruption); a longer D list is refused",
        effect: Effect::Corrupts,
        in_vllm: &["0.30.0", "0.31.0", "0.32.0", "0.33.0"],
        read_in_vllm: &[],
        select: |p| p.prefix_alignment = PrefixAlignment::EndTrim,
    },
    DefectInfo {
        defect: Defect::ReplicatedHeadsNhdAccepted,
        name: "replicated-heads-nhd-accepted",
        title: "vLLM 0.33.0 NHD pages accepted for gathered replicated heads",
        bug: "vLLM 0.33.0's handshake accepts token-major (NHD) pages when a rank gathers heads from prefill ranks that replicate them",
        symptom: "each prefill page lands in a byte slot, not a head slot: tokens and heads scrambled",
        effect: Effect::Corrupts,
        in_vllm: &["0.30.0", "0.31.0", "0.32.0", "0.33.0", "0.34.0"],
        read_in_vllm: &[],
        select: |p| p.handshake.gathered_replicated_heads_nhd = Acceptance::Accept,
    },
    DefectInfo {
        defect: Defect::ZeroingOnePastEnd,
        name: "zeroing-one-past-end",
        title: "receive zeroing one kernel block past the end",
        bug: "the receive post-process zeroes its stale blocks through an inclusive end: one kernel block past the request's last is zeroed too",
        symptom: "the block after the request's, which belongs to another request or the free pool, loses its KV (silent corruption of a co-resident request)",
        effect: Effect::Corrupts,
        in_vllm: &[],
        read_in_vllm: &[],
        select: |p| p.receive_zeroing = ReceiveZeroing::InclusiveEnd,
    },
    DefectInfo {
        defect: Defect::ConvOffsetsScaled,
        name: "conv-offsets-scaled",
        title: "vLLM 0.33.0 conv offsets scaled from the local widths",
        bug: "vLLM 0.33.0 locates the peer's conv sub-projections by scaling its own widths by the TP ratio; Mamba2 B and C replicated beyond n_groups (one group) keep their width at every TP",
        symptom: "decode's B and C conv state receive half of B twice, the other projection or SSM bytes, with no error (Falcon-H1, Granite-4.0-H, Zamba2 at different TP sizes)",
        effect: Effect::Corrupts,
        in_vllm: &["0.30.0", "0.31.0", "0.32.0", "0.33.0", "0.34.0"],
        read_in_vllm: &[],
        select: |p| p.conv_split = ConvSplit::LocalWidthsScaled,
    },
    DefectInfo {
        defect: Defect::PaddedPagesRefusedWhenShared,
        name: "padded-pages-refused-when-shared",
        title: "vLLM 0.33.0 refuses padded pages in a shared allocation",
        bug: "vLLM 0.33.0 registers a layer's view as whole runs of its blocks; a padded page (block stride larger than the page) in an allocation shared by several layer slots leaves a view whose bytes are not such runs, and registration asserts",
        symptom: "the engine fails at start (AssertionError: KV cache view cannot be partitioned into NIXL regions) for any padded kernel page layout with more than one layer slot",
        effect: Effect::Corrupts,
        in_vllm: &["0.30.0", "0.31.0", "0.32.0", "0.33.0", "0.34.0"],
        read_in_vllm: &[],
        select: |p| p.padded_pages = PaddedPageRegistration::RefusedWhenShared,
    },
    DefectInfo {
        defect: Defect::LastTokenPairing,
        name: "last-token-pairing",
        title: "vLLM 0.34.0 pairs block lists from the last token",
        bug: "vLLM 0.34.0's pull across different kernel or logical block sizes drops each side's sub-blocks past prefill's token count and pairs the lists from their ends (equal block sizes still end-trim); right only when decode's list ends in the logical block of prefill's last token",
        symptom: "a decode list one logical block longer (the recomputed last token's block) receives prefill's tokens in its later blocks and the head zeroing wipes its first ones; after a prefix hit with equal block sizes, the end-trim pairs the wrong tokens (silent corruption)",
        effect: Effect::Corrupts,
        in_vllm: &["0.34.0"],
        read_in_vllm: &[],
        select: |p| p.prefix_alignment = PrefixAlignment::LastTokenWhenSizesDiffer,
    },
    DefectInfo {
        defect: Defect::PushIdenticalBlockSizesOnly,
        name: "push-identical-block-sizes-only",
        title: "vLLM 0.34.0 push refuses any P/D block-size difference",
        bug: "vLLM 0.34.0's push worker refuses, at the handshake, any pair whose kernel block size or kernel blocks per logical block differ",
        symptom: "push between engines of different block geometry (which pull serves) fails the handshake with NotImplementedError: NixlPushConnector requires identical P/D block sizes",
        effect: Effect::Corrupts,
        in_vllm: &["0.34.0"],
        read_in_vllm: &[],
        select: |p| p.push.block_sizes = PushBlockSizes::IdenticalOnly,
    },
];

impl Defect {
    /// Every defect, in table order.
    pub const ALL: [Defect; 20] = [
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
        Defect::SplitHeadSlotIgnored,
        Defect::EndTrimAlignment,
        Defect::ReplicatedHeadsNhdAccepted,
        Defect::ZeroingOnePastEnd,
        Defect::ConvOffsetsScaled,
        Defect::PaddedPagesRefusedWhenShared,
        Defect::LastTokenPairing,
        Defect::PushIdenticalBlockSizesOnly,
    ];

    /// This defect's row of the table.
    pub fn info(self) -> &'static DefectInfo {
        DEFECTS
            .iter()
            .find(|row| row.defect == self)
            .expect("every defect has a row in DEFECTS")
    }

    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        self.info().name
    }

    /// The defect whose command-line name is `name`, if any.
    pub fn from_name(name: &str) -> Option<Defect> {
        DEFECTS
            .iter()
            .find(|row| row.name == name)
            .map(|row| row.defect)
    }

    /// A few words naming the defect in reports.
    pub fn title(self) -> &'static str {
        self.info().title
    }

    /// What the bug was.
    pub fn description(self) -> &'static str {
        self.info().bug
    }

    /// The real-world symptom it caused.
    pub fn symptom(self) -> &'static str {
        self.info().symptom
    }

    /// Whether vLLM `version` as released has it (by a committed matrix
    /// run, or by a reading of the wheel where the matrix cannot tell).
    pub fn in_vllm(self, version: &str) -> bool {
        let info = self.info();
        info.in_vllm.contains(&version) || info.read_in_vllm.contains(&version)
    }

    /// The defects of vLLM `version` as released, in table order (none for
    /// a release the table does not name).
    pub fn of_vllm(version: &str) -> Vec<Defect> {
        Defect::ALL
            .into_iter()
            .filter(|d| d.in_vllm(version))
            .collect()
    }

    /// kvgeom's policy with this defect's decision.
    pub fn policy(self) -> Policy {
        policy_with(&[self])
    }
}

/// kvgeom's policy with the decisions of every defect in `defects`, applied
/// in the order given.
pub fn policy_with(defects: &[Defect]) -> Policy {
    let mut policy = Policy::default();
    for d in defects {
        (d.info().select)(&mut policy);
    }
    policy
}

impl std::fmt::Display for Defect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_has_one_row_per_defect_in_order() {
        assert_eq!(DEFECTS.len(), Defect::ALL.len());
        for (row, d) in DEFECTS.iter().zip(Defect::ALL) {
            assert_eq!(row.defect, d);
            assert_eq!(Defect::from_name(row.name), Some(d));
        }
    }

    #[test]
    fn every_defect_changes_the_policy_and_no_two_agree() {
        let policies: Vec<Policy> = Defect::ALL.iter().map(|d| d.policy()).collect();
        for (i, p) in policies.iter().enumerate() {
            assert_ne!(*p, Policy::default(), "{} selects nothing", Defect::ALL[i]);
            for q in &policies[i + 1..] {
                assert_ne!(p, q);
            }
        }
    }

    #[test]
    fn a_release_is_exactly_the_defects_the_table_names_for_it() {
        for version in ["0.34.0", "0.33.0", "0.32.0"] {
            let mut policy = Policy::default();
            for row in DEFECTS
                .iter()
                .filter(|row| row.in_vllm.contains(&version) || row.read_in_vllm.contains(&version))
            {
                (row.select)(&mut policy);
            }
            assert_eq!(policy, policy_with(&Defect::of_vllm(version)));
        }
        // Read from the 0.34.0 wheel: the conv split, the push protocol and
        // the registration and NHD decisions are unchanged; the end-trim is
        // replaced by pairing from the last token, and push refuses any
        // difference in block geometry.
        let newer = Defect::of_vllm("0.34.0");
        for kept in [
            Defect::ConvOffsetsScaled,
            Defect::ReplicatedHeadsNhdAccepted,
            Defect::PaddedPagesRefusedWhenShared,
            Defect::PushReplicatedDoubleWrite,
            Defect::LastTokenPairing,
            Defect::PushIdenticalBlockSizesOnly,
        ] {
            assert!(newer.contains(&kept), "{kept}");
        }
        assert!(!newer.contains(&Defect::EndTrimAlignment));
        assert!(!Defect::of_vllm("0.33.0").contains(&Defect::LastTokenPairing));
        // The releases before the pinned one have exactly its defects
        // (`kvgeom matrix`, MATRIX_FIXTURE).
        assert_eq!(Defect::of_vllm("0.32.0"), Defect::of_vllm("0.33.0"));
        assert!(Defect::of_vllm("0.29.0").is_empty());
        assert_eq!(policy_with(&[]), Policy::default());
    }

    /// Rows added after a committed matrix report was made, which it may
    /// lack: those first read from the 0.34.0 wheel (the models matrix,
    /// 0.30.0-0.33.0, was made before them) and the differing-bytes double
    /// write (added after both).
    fn newer_than_matrices(info: &DefectInfo) -> bool {
        matches!(
            info.defect,
            Defect::LastTokenPairing
                | Defect::PushIdenticalBlockSizesOnly
                | Defect::SplitHeadSlotIgnored
        )
    }

    /// Every (release, defect row, table row) of a committed matrix
    /// report, after checking its schema, that every release ran and that
    /// its rows follow the table's order.
    fn matrix_rows(fixture: &str) -> Vec<(String, serde_json::Value, &'static DefectInfo)> {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(fixture);
        let text = std::fs::read_to_string(&path).expect("a committed matrix report");
        let doc: serde_json::Value = serde_json::from_str(&text).expect("JSON");
        assert_eq!(doc["schema"], "kvgeom-matrix/1");
        let mut out = Vec::new();
        let mut ran = Vec::new();
        for release in doc["releases"].as_array().expect("releases") {
            assert_eq!(release["status"], "ran", "{}", release["python"]);
            let version = release["version"].as_str().expect("version");
            ran.push(version.to_string());
            let rows = release["defects"].as_array().expect("defects");
            // The report's rows follow the table's order; a report made
            // before a row was added lacks only such rows.
            let mut table = DEFECTS.iter();
            for row in rows {
                let info = table
                    .find(|info| row["defect"] == info.name || !newer_than_matrices(info))
                    .filter(|info| row["defect"] == info.name)
                    .unwrap_or_else(|| {
                        panic!("vLLM {version}: {} out of the table's order", row["defect"])
                    });
                out.push((version.to_string(), row.clone(), info));
            }
            assert!(
                table.all(newer_than_matrices),
                "vLLM {version}: the report lacks a row older than it"
            );
        }
        out
    }

    /// Each row's `in_vllm` names exactly the releases of the committed
    /// matrix whose verdict on it is `has`, and only releases it ran.
    #[test]
    fn in_vllm_equals_the_committed_matrix() {
        let rows = matrix_rows(MATRIX_FIXTURE);
        for info in &DEFECTS {
            for v in info.in_vllm {
                assert!(
                    rows.iter().any(|(r, _, _)| r == v),
                    "{}: vLLM {v} is not in {MATRIX_FIXTURE}",
                    info.name
                );
            }
            // A reading of a wheel stands only where the matrix cannot tell.
            for v in info.read_in_vllm {
                for (_, row, _) in rows
                    .iter()
                    .filter(|(r, _, i)| r == v && i.name == info.name)
                {
                    assert!(
                        row["verdict"] == "not exposed" || row["verdict"] == "undetermined",
                        "{} in vLLM {v}: read from the wheel, but the matrix says {}",
                        info.name,
                        row["verdict"]
                    );
                }
            }
        }
        for (version, row, info) in rows {
            let has = row["verdict"] == "has";
            assert_eq!(
                info.in_vllm.contains(&version.as_str()),
                has,
                "{} in vLLM {version}: the matrix says {} ({} with, {} without, {} neither of {} exposing cases)",
                info.name,
                row["verdict"],
                row["with"],
                row["without"],
                row["neither"],
                row["exposed"]
            );
        }
    }

    /// The models matrix never contradicts the table: each `has` is a
    /// release `in_vllm` names, each `lacks` one it does not (`undetermined`
    /// and `not exposed` say nothing).
    #[test]
    fn in_vllm_agrees_with_the_models_matrix() {
        let mut decided = 0;
        for (version, row, info) in matrix_rows(MODELS_MATRIX_FIXTURE) {
            let verdict = row["verdict"].as_str().expect("verdict");
            let has = match verdict {
                "has" => true,
                "lacks" => false,
                _ => continue,
            };
            decided += 1;
            assert_eq!(
                info.in_vllm.contains(&version.as_str()),
                has,
                "{} in vLLM {version}: the models matrix says {verdict}",
                info.name
            );
        }
        assert!(decided > 0, "the models matrix decided no defect");
    }

    #[test]
    fn titles_are_short_and_distinct() {
        let mut seen = std::collections::HashSet::new();
        for row in &DEFECTS {
            assert!(
                !row.title.is_empty() && row.title.len() <= 70,
                "{}",
                row.name
            );
            assert!(seen.insert(row.title), "{} repeats a title", row.name);
        }
    }
}
