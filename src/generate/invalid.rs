//! The deliberately invalid cases: a geometry-file rule broken on an
//! otherwise valid geometry ([`BrokenRule`]), or a P/D pair the connector's
//! handshake must refuse ([`Refusal`], drawn by `draw.rs` with that one
//! constraint bent). Each knows the error it must produce.

use arbitrary::{Result, Unstructured};

use crate::geometry::{
    AttentionSpec, Engine, EngineGeometry, Geometry, MambaKind, Rule, Violation,
};

/// A pair that kvgeom's handshake refuses, by the check that refuses it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// Prefill and decode TP sizes are not multiples of one another.
    TpNotDivisible,
    /// Decode's kernel block is not a multiple of prefill's (and no gcd view applies).
    BlockSizeNotDivisible,
    /// A mamba hybrid with prefix caching on decode and different ppl.
    PrefixCachingHeteroPpl,
    /// Host-buffer staging on decode with a kernel-block ratio.
    HostBufferWithRatio,
    /// Full attention with different layouts on the two engines.
    LayoutMismatch,
    /// Heads split across different TP sizes in a token-major (NHD) layout.
    HeadSplitNeedsContiguousLayout,
    /// Dense attention whose decode rank would read replicated KV heads from
    /// several prefill ranks.
    ReplicatedKvMultiRead,
    /// Dense attention read from several prefill ranks with a kernel ratio.
    RatioWithMultiRead,
    /// Hybrid full attention whose heads come from several prefill ranks with
    /// a kernel ratio.
    HeadShardedWithRatio,
    /// Token-major (NHD) pages on a hybrid whose decode rank gathers heads
    /// from several prefill ranks that replicate them (vLLM 0.33.0 accepts
    /// this and scrambles heads; kvgeom refuses it).
    GatheredReplicatedHeadsNhd,
}

impl Refusal {
    /// Every refusal, in the order the generator cycles through them.
    pub const ALL: [Refusal; 10] = [
        Refusal::TpNotDivisible,
        Refusal::BlockSizeNotDivisible,
        Refusal::PrefixCachingHeteroPpl,
        Refusal::HostBufferWithRatio,
        Refusal::LayoutMismatch,
        Refusal::HeadSplitNeedsContiguousLayout,
        Refusal::ReplicatedKvMultiRead,
        Refusal::RatioWithMultiRead,
        Refusal::HeadShardedWithRatio,
        Refusal::GatheredReplicatedHeadsNhd,
    ];

    /// Text the refusal message must contain (the geometry's `expect_rejection`).
    pub fn message(self) -> &'static str {
        match self {
            Refusal::TpNotDivisible => "TP sizes are not multiples of one another",
            Refusal::BlockSizeNotDivisible => "is not divisible by remote block size",
            Refusal::PrefixCachingHeteroPpl => {
                "Prefix caching with heterogeneous physical_blocks_per_logical is not supported"
            }
            Refusal::HostBufferWithRatio => {
                "Heterogeneous block sizes are not supported with host buffer"
            }
            Refusal::LayoutMismatch => "Heterogeneous TP expects same kv_cache_layout",
            Refusal::HeadSplitNeedsContiguousLayout | Refusal::GatheredReplicatedHeadsNhd => {
                "head-dimension splitting requires contiguous heads"
            }
            Refusal::ReplicatedKvMultiRead => {
                "P_TP > D_TP with replicated KV heads is not supported"
            }
            Refusal::RatioWithMultiRead => {
                "Different local/remote block sizes are not supported when P TP > D TP"
            }
            Refusal::HeadShardedWithRatio => {
                "Head-sharded attention reads with P_TP > D_TP and heterogeneous block sizes"
            }
        }
    }

    /// `Some(true)`: full (GQA) attention; `Some(false)`: MLA; `None`: either.
    pub(crate) fn needs_full_attention(self) -> Option<bool> {
        match self {
            Refusal::LayoutMismatch
            | Refusal::HeadSplitNeedsContiguousLayout
            | Refusal::ReplicatedKvMultiRead
            | Refusal::RatioWithMultiRead
            | Refusal::HeadShardedWithRatio
            | Refusal::GatheredReplicatedHeadsNhd => Some(true),
            _ => None,
        }
    }

    /// `Some(true)`: a mamba hybrid; `Some(false)`: attention only.
    pub(crate) fn needs_mamba(self) -> Option<bool> {
        match self {
            Refusal::PrefixCachingHeteroPpl
            | Refusal::HeadShardedWithRatio
            | Refusal::GatheredReplicatedHeadsNhd => Some(true),
            Refusal::ReplicatedKvMultiRead | Refusal::RatioWithMultiRead => Some(false),
            _ => None,
        }
    }

    pub(crate) fn needs_different_tp(self) -> bool {
        matches!(
            self,
            Refusal::HeadSplitNeedsContiguousLayout
                | Refusal::ReplicatedKvMultiRead
                | Refusal::RatioWithMultiRead
                | Refusal::HeadShardedWithRatio
                | Refusal::GatheredReplicatedHeadsNhd
        )
    }

    /// `Some(true)`: prefill's TP larger than decode's.
    pub(crate) fn needs_prefill_tp_larger(self) -> Option<bool> {
        match self {
            Refusal::ReplicatedKvMultiRead
            | Refusal::RatioWithMultiRead
            | Refusal::HeadShardedWithRatio
            | Refusal::GatheredReplicatedHeadsNhd => Some(true),
            _ => None,
        }
    }
}

/// A geometry-file rule to break on a valid geometry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BrokenRule {
    /// `model.groups` is empty.
    NoGroups,
    /// Mamba groups without an attention group.
    MambaWithoutAttention,
    /// `model.layer_slots = 0`.
    ZeroLayerSlots,
    /// An attention `dtype_bytes` outside 1, 2, 4, 8.
    AttentionDtype,
    /// Two conv dimensions the mamba kind requires equal differ.
    UnequalConvPair,
    /// An engine with `tp_size = 0`.
    ZeroTpSize,
    /// A kernel block that does not divide the logical block.
    KernelDoesNotDivideLogical,
    /// KV heads that neither shard nor replicate over TP.
    KvHeadsVsTp,
    /// Conv channels that do not split evenly over TP.
    ConvNotSplitOverTp,
    /// A mamba state too large for the padded page.
    MambaStateExceedsPage,
}

impl BrokenRule {
    /// Rules that apply to any geometry alternate with those that need
    /// mamba or full attention, so that skipping an inapplicable rule does
    /// not favour one.
    pub const ALL: [BrokenRule; 10] = [
        BrokenRule::KernelDoesNotDivideLogical,
        BrokenRule::MambaStateExceedsPage,
        BrokenRule::ZeroTpSize,
        BrokenRule::ConvNotSplitOverTp,
        BrokenRule::AttentionDtype,
        BrokenRule::UnequalConvPair,
        BrokenRule::ZeroLayerSlots,
        BrokenRule::MambaWithoutAttention,
        BrokenRule::NoGroups,
        BrokenRule::KvHeadsVsTp,
    ];

    /// Break this rule in `g` (valid) and return the violation `validate`
    /// must report; `None` when the rule does not apply to this geometry
    /// (e.g. a mamba rule on a model without mamba). Nothing else changes,
    /// so no earlier rule can fire first.
    pub fn apply(self, u: &mut Unstructured<'_>, g: &mut Geometry) -> Result<Option<Violation>> {
        let engine = if u.arbitrary::<bool>()? {
            Engine::Decode
        } else {
            Engine::Prefill
        };
        Ok(match self {
            BrokenRule::NoGroups => {
                g.model.groups.clear();
                Some(Violation::new("model.groups", Rule::NoGroups))
            }
            BrokenRule::MambaWithoutAttention => {
                if g.model.mamba.is_none() {
                    return Ok(None);
                }
                g.model.attention = None;
                g.model
                    .groups
                    .retain(|k| *k == crate::geometry::GroupKind::Mamba);
                Some(Violation::new("model.groups", Rule::MambaWithoutAttention))
            }
            BrokenRule::ZeroLayerSlots => {
                g.model.layer_slots = 0;
                Some(Violation::new(
                    "model.layer_slots",
                    Rule::NotPositive { found: 0 },
                ))
            }
            BrokenRule::AttentionDtype => {
                let found = *u.choose(&[0u32, 3, 5, 6, 16])?;
                match g.model.attention.as_mut() {
                    Some(AttentionSpec::Mla { dtype_bytes, .. })
                    | Some(AttentionSpec::Full { dtype_bytes, .. }) => *dtype_bytes = found,
                    None => return Ok(None),
                }
                Some(Violation::new(
                    "model.attention.dtype_bytes",
                    Rule::DtypeBytes { found },
                ))
            }
            BrokenRule::UnequalConvPair => {
                let Some(mamba) = g.model.mamba.as_mut() else {
                    return Ok(None);
                };
                let (a, b) = match mamba.kind {
                    MambaKind::Mamba2 => (1, 2),
                    MambaKind::Gdn => (0, 1),
                    MambaKind::Mamba1 | MambaKind::Kda => return Ok(None),
                };
                mamba.conv_dims[b] += mamba.conv_dims[a];
                Some(Violation::new(
                    format!("model.mamba.conv_dims[{b}]"),
                    Rule::UnequalConvPair {
                        kind: mamba.kind,
                        first: mamba.conv_dims[a],
                        second: mamba.conv_dims[b],
                    },
                ))
            }
            BrokenRule::ZeroTpSize => {
                engine_mut(g, engine).tp_size = 0;
                Some(Violation::new(
                    format!("{engine}.tp_size"),
                    Rule::NotPositive { found: 0 },
                ))
            }
            BrokenRule::KernelDoesNotDivideLogical => {
                let e = engine_mut(g, engine);
                let kernel = e.kernel_block.max(2);
                let logical = kernel * e.ppl() + u.int_in_range(1..=kernel - 1)?;
                e.kernel_block = kernel;
                e.logical_block = logical;
                Some(Violation::new(
                    format!("{engine}.kernel_block"),
                    Rule::KernelDoesNotDivideLogical { kernel, logical },
                ))
            }
            BrokenRule::KvHeadsVsTp => kv_heads_vs_tp(g),
            BrokenRule::ConvNotSplitOverTp => conv_not_split(g),
            BrokenRule::MambaStateExceedsPage => state_exceeds_page(g),
        })
    }
}

fn engine_mut(g: &mut Geometry, engine: Engine) -> &mut EngineGeometry {
    match engine {
        Engine::Prefill => &mut g.prefill,
        Engine::Decode => &mut g.decode,
    }
}

fn engines(g: &Geometry) -> [(Engine, &EngineGeometry); 2] {
    [(Engine::Prefill, &g.prefill), (Engine::Decode, &g.decode)]
}

/// Full attention with a head count neither TP size divides nor is divided by.
fn kv_heads_vs_tp(g: &mut Geometry) -> Option<Violation> {
    let Some(AttentionSpec::Full { total_kv_heads, .. }) = g.model.attention.as_mut() else {
        return None;
    };
    let fits = |h: u32, tp: u32| h % tp == 0 || tp % h == 0;
    let tps = [g.prefill.tp_size, g.decode.tp_size];
    // Smallest count that breaks the rule for at least one TP size.
    let heads = (2..=64).find(|&h| tps.iter().any(|&tp| !fits(h, tp)))?;
    *total_kv_heads = heads;
    let (engine, tp) = engines(g)
        .into_iter()
        .map(|(e, geom)| (e, geom.tp_size))
        .find(|&(_, tp)| !fits(heads, tp))?;
    Some(Violation::new(
        "model.attention.total_kv_heads",
        Rule::KvHeadsVsTp { heads, engine, tp },
    ))
}

/// One more conv channel in a sub-projection that has no equal partner.
fn conv_not_split(g: &mut Geometry) -> Option<Violation> {
    let tps = [g.prefill.tp_size, g.decode.tp_size];
    let mamba = g.model.mamba.as_mut()?;
    if tps.iter().all(|&tp| tp == 1) {
        return None;
    }
    let i = match mamba.kind {
        MambaKind::Mamba1 | MambaKind::Mamba2 => 0,
        MambaKind::Gdn | MambaKind::Kda => 2,
    };
    mamba.conv_dims[i] += 1;
    let value = mamba.conv_dims[i];
    let (engine, tp) = [
        (Engine::Prefill, g.prefill.tp_size),
        (Engine::Decode, g.decode.tp_size),
    ]
    .into_iter()
    .find(|&(_, tp)| value % tp != 0)?;
    Some(Violation::new(
        format!("model.mamba.conv_dims[{i}]"),
        Rule::NotSplitOverTp {
            value: value.into(),
            what: "conv channels",
            engine,
            tp,
        },
    ))
}

/// An SSM state larger than either engine's page (still split over TP).
fn state_exceeds_page(g: &mut Geometry) -> Option<Violation> {
    let attention = g.model.attention.clone()?;
    let unit = u64::from(g.prefill.tp_size) * u64::from(g.decode.tp_size);
    let largest_page = engines(g)
        .iter()
        .map(|(_, e)| attention.bytes_per_token(e.tp_size) * u64::from(e.logical_block))
        .max()?;
    let mamba = g.model.mamba.as_mut()?;
    mamba.ssm_state_bytes = (largest_page + 1) * unit;
    let mamba = mamba.clone();
    // Prefill is checked first, and its page is exceeded too.
    let e = &g.prefill;
    let per_token = attention.bytes_per_token(e.tp_size);
    let (conv, ssm) = mamba.ssm_sizes(e.tp_size);
    let kernel_page = per_token * u64::from(e.kernel_block);
    Some(Violation::new(
        "prefill.logical_block",
        Rule::MambaStateExceedsPage {
            tp: e.tp_size,
            conv,
            ssm,
            page: per_token * u64::from(e.logical_block),
            logical: e.logical_block,
            per_token,
            min_logical: (conv + ssm).div_ceil(kernel_page) * u64::from(e.kernel_block),
        },
    ))
}
