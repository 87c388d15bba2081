//! Drawing one P/D geometry and one request from raw bytes.
//!
//! Every knob stays within a named bound below, and every constraint that
//! the geometry rules (`geometry/validate.rs`) and kvgeom's handshake
//! (`connector/handshake.rs`, `connector/split_lists.rs`) impose is honoured
//! by construction, so the drawn case is supported and must pass every
//! oracle. A [`Refusal`] target bends exactly one handshake constraint
//! instead, and the geometry then expects that refusal. Each bound's
//! smallest value is the simplest choice, so exhausted input (and shrinking)
//! yields a small MLA pull case. [`GeneratedCase`]'s `Arbitrary` draws
//! here too: one case in [`INVALID_ONE_IN`] breaks a geometry rule or a
//! handshake constraint.
//!
//! The generator also draws the regions where vLLM 0.33.0 transfers
//! wrongly and kvgeom deliberately does not (different logical blocks
//! without mamba, prefix hits on any logical blocks, the last-token block
//! with a prefix hit, NHD pages gathered from replicated heads, which
//! kvgeom refuses): the matching defect variants
//! (`end-trim-alignment`, `replicated-heads-nhd-accepted`) fail there.

use arbitrary::{Arbitrary, Result, Unstructured};

use crate::geometry::{
    AttentionSpec, EngineGeometry, ExpectedRejection, Geometry, GroupKind, KvLayout, MambaKind,
    MambaSpec, Mode, ModelSpec,
};
use crate::scheduler::{request_shape, DecodeAllocation};

use super::case::{Expected, GeneratedCase, INVALID_ONE_IN};
use super::invalid::{BrokenRule, Refusal};

/// Largest TP size of either engine.
pub const MAX_TP: u32 = 8;
/// The smaller TP size is one of these ...
const TP_BASES: [u32; 4] = [1, 2, 3, 4];
/// ... and the larger one this multiple of it (capped at [`MAX_TP`]).
const TP_FACTORS: [u32; 3] = [1, 2, 4];
/// TP pairs that are not multiples of one another (refusals only).
const NON_DIVISIBLE_TPS: [(u32, u32); 6] = [(2, 3), (3, 2), (3, 4), (4, 3), (4, 6), (6, 4)];
/// `(prefill, decode)` TP pairs where a decode rank can gather replicated
/// heads from several prefill ranks (a head count strictly between them).
const GATHERING_TPS: [(u32, u32); 3] = [(4, 1), (8, 1), (8, 2)];
/// Layer slots (shared KV tensors, one NIXL region each).
pub const MAX_LAYER_SLOTS: u32 = 3;
/// Mamba KV-cache groups next to the one attention group.
pub const MAX_MAMBA_GROUPS: u32 = 2;
/// KV head counts of full attention (filtered by what both TP sizes allow).
const KV_HEADS: [u32; 8] = [1, 2, 3, 4, 6, 8, 12, 16];
/// Elements per attention head (per latent for MLA).
pub const MAX_HEAD_SIZE: u32 = 16;
const DTYPE_BYTES: [u32; 4] = [1, 2, 4, 8];
/// Attention bytes per token on the rank holding the most heads.
pub const MAX_TOKEN_BYTES: u64 = 128;
/// The smaller kernel block (tokens).
pub const MAX_KERNEL_BASE: u32 = 8;
/// Decode kernel / prefill kernel.
const KERNEL_RATIOS: [u32; 3] = [1, 2, 4];
/// Prefill kernel / decode kernel, at most, when prefill's kernel is larger
/// (hybrid MLA only).
const MAX_PREFILL_KERNEL_FACTOR: u32 = 4;
/// Physical (kernel) blocks per logical block, as drawn; a mamba state may
/// raise it up to `MAX_MAMBA_PPL`.
pub const MAX_PPL: u32 = 4;
/// Above this ppl a drawn mamba state is cut to its smallest size.
const MAX_MAMBA_PPL: u64 = 16;
/// Conv channels of one sub-projection, in units of the larger TP size.
pub const MAX_CONV_UNITS: u32 = 4;
/// Largest drawn `conv_rows` (conv kernel width - 1).
pub const MAX_CONV_ROWS: u32 = 4;
/// SSM state bytes, in units of the larger TP size.
pub const MAX_SSM_UNITS: u64 = 16;
/// Prompt length (tokens).
pub const MAX_PROMPT: u32 = 256;
/// Logical blocks beyond the request's own when a pool size is fixed.
const MAX_EXTRA_POOL_BLOCKS: u32 = 3;
/// KV bytes of all ranks of both engines together; larger draws are shrunk
/// (fewer layer slots, shorter prompt, no padding).
pub const MAX_CASE_BYTES: u64 = 2 << 20;

/// The attention/mamba shape of the model and what it implies.
struct Shape {
    full: bool,
    mamba: Option<MambaKind>,
}

impl Shape {
    fn hybrid_mla(&self) -> bool {
        !self.full && self.mamba.is_some()
    }
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

fn lcm(a: u32, b: u32) -> u32 {
    a / gcd(a, b) * b
}

/// Heads shard (`heads % tp == 0`) or replicate (`tp % heads == 0`) evenly.
fn heads_fit(heads: u32, tp: u32) -> bool {
    heads % tp == 0 || tp % heads == 0
}

fn pick<T: Copy>(u: &mut Unstructured<'_>, items: &[T]) -> Result<T> {
    Ok(items[u.choose_index(items.len())?])
}

impl<'a> Arbitrary<'a> for GeneratedCase {
    fn arbitrary(u: &mut Unstructured<'a>) -> Result<Self> {
        // The last value of the range marks an invalid case, so exhausted
        // input (all zeros) gives a valid one.
        let invalid = u.int_in_range(0..=INVALID_ONE_IN - 1)? == INVALID_ONE_IN - 1;
        if invalid && u.arbitrary::<bool>()? {
            let refusal = Refusal::ALL[u.choose_index(Refusal::ALL.len())?];
            let mut case = draw(u, Some(refusal))?;
            case.expected = Expected::Refused(refusal);
            return Ok(case);
        }
        let mut case = draw(u, None)?;
        if invalid {
            let first = u.choose_index(BrokenRule::ALL.len())?;
            // The first rule (in a rotation from `first`) that applies.
            for rule in BrokenRule::ALL
                .iter()
                .cycle()
                .skip(first)
                .take(BrokenRule::ALL.len())
            {
                if let Some(violation) = rule.apply(u, &mut case.geometry)? {
                    case.expected = Expected::Invalid(violation);
                    return Ok(case);
                }
            }
        }
        Ok(case)
    }
}

/// Draw a case, expected to pass (the caller says otherwise). With
/// `refusal`, the geometry breaks that handshake constraint (and only that
/// one) and carries its message in `expect_rejection`.
pub(crate) fn draw(u: &mut Unstructured<'_>, refusal: Option<Refusal>) -> Result<GeneratedCase> {
    let mode = if u.arbitrary::<bool>()? {
        Mode::Push
    } else {
        Mode::Pull
    };
    let shape = Shape {
        full: match refusal.and_then(Refusal::needs_full_attention) {
            Some(full) => full,
            None => u.arbitrary()?,
        },
        mamba: match refusal.and_then(Refusal::needs_mamba) {
            Some(false) => None,
            Some(true) => Some(pick(u, &MAMBA_KINDS)?),
            None => match u.int_in_range(0..=MAMBA_KINDS.len())? {
                0 => None,
                i => Some(MAMBA_KINDS[i - 1]),
            },
        },
    };
    let groups = draw_groups(u, &shape)?;
    let layer_slots = u.int_in_range(1..=MAX_LAYER_SLOTS)?;
    let (p_tp, d_tp) = draw_tp_sizes(u, refusal)?;
    let attention = draw_attention(u, &shape, mode, p_tp, d_tp, refusal)?;
    let heads = attention.total_kv_heads();
    let (p_layout, d_layout) = draw_layouts(u, &shape, p_tp, d_tp, heads, refusal)?;
    let (p_kernel, d_kernel) = draw_kernels(u, &shape, mode, p_tp, d_tp, heads, refusal)?;
    // Hybrid MLA pull with a prefill kernel that is not a divisor of the
    // decode kernel: decode views prefill pages as gcd-sized blocks, which
    // needs unpadded prefill pages (and changes the ppl decode compares).
    let gcd_split = shape.hybrid_mla() && d_kernel % p_kernel != 0;
    let split = if gcd_split {
        p_kernel / gcd(p_kernel, d_kernel)
    } else {
        1
    };
    // Prefill's pages per logical block are drawn before decode's.
    let p_logical = p_kernel * u.int_in_range(1..=MAX_PPL)?;
    let mut prefill = EngineGeometry {
        layout: p_layout,
        ..EngineGeometry::new(p_tp, p_kernel, p_logical)
    };
    let d_logical = d_kernel * u.int_in_range(1..=MAX_PPL)?;
    let mut decode = EngineGeometry {
        layout: d_layout,
        ..EngineGeometry::new(d_tp, d_kernel, d_logical)
    };
    let padded_prefill_refused =
        refusal == Some(Refusal::BlockSizeNotDivisible) && shape.hybrid_mla();
    prefill.block_padding_bytes = draw_padding(
        u,
        &attention,
        &prefill,
        gcd_split && !padded_prefill_refused,
        padded_prefill_refused,
    )?;
    decode.block_padding_bytes = draw_padding(u, &attention, &decode, false, false)?;
    let mut model = ModelSpec {
        attention: Some(attention),
        mamba: None,
        groups,
        layer_slots,
        state_slots: None,
    };
    if let Some(kind) = shape.mamba {
        let mamba = draw_mamba(u, kind, &model, &prefill, &decode)?;
        let fit = |engine: &mut EngineGeometry| {
            let needed = mamba_ppl(&mamba, &model, engine);
            engine.logical_block = engine.logical_block.max(engine.kernel_block * needed);
        };
        fit(&mut prefill);
        fit(&mut decode);
        model.mamba = Some(mamba);
    }
    let has_mamba = model.has_mamba();
    // Decode compares its ppl with prefill's (times the gcd split).
    let pull_ppl_differs = decode.ppl() != prefill.ppl() * split;
    if refusal == Some(Refusal::PrefixCachingHeteroPpl) && !pull_ppl_differs {
        decode.logical_block += decode.kernel_block;
    }
    draw_host_buffers(u, mode, &mut prefill, &mut decode, refusal)?;
    draw_prefix_caching(
        u,
        mode,
        has_mamba,
        split,
        &mut prefill,
        &mut decode,
        refusal,
    )?;
    let mut geometry = Geometry {
        name: "generated".into(),
        description: "drawn by kvgeom::generate".into(),
        model,
        prefill,
        decode,
        prompts: None,
        expect_rejection: refusal.map(|r| ExpectedRejection::both(r.message())),
        stack: crate::geometry::Stack::Vllm,
        handshake: crate::geometry::HandshakeCompat::default(),
        sglang: None,
    };
    let max_logical = geometry
        .prefill
        .logical_block
        .max(geometry.decode.logical_block);
    let max_kernel = p_kernel.max(d_kernel);
    let prompt_bound = (2 * max_logical + max_kernel + 1).min(MAX_PROMPT);
    let mut prompt_len = u.int_in_range(1..=prompt_bound)?;
    let hit_blocks = u.int_in_range(0..=u32::MAX)?;
    let with_last_token = u.arbitrary::<bool>()?;
    let pools = [draw_pool(u)?, draw_pool(u)?];
    let seed = u.arbitrary::<u64>()?;
    let mut prefix_hit = prefix_hit(&geometry, prompt_len, hit_blocks);
    // The extra block of the recomputed last token only exists for hybrids.
    let allocation = if with_last_token && geometry.model.has_mamba() {
        DecodeAllocation::WithLastToken
    } else {
        DecodeAllocation::Mainline
    };
    size_pools(&mut geometry, prompt_len, prefix_hit, allocation, pools);
    while case_bytes(&geometry, prompt_len, prefix_hit, allocation) > MAX_CASE_BYTES {
        if geometry.model.layer_slots > 1 {
            geometry.model.layer_slots = 1;
        } else if prompt_len > 1 {
            prompt_len /= 2;
        } else if geometry.prefill.block_padding_bytes + geometry.decode.block_padding_bytes > 0
            && !padded_prefill_refused
        {
            geometry.prefill.block_padding_bytes = 0;
            geometry.decode.block_padding_bytes = 0;
        } else {
            break;
        }
        prefix_hit = prefix_hit_clamped(&geometry, prompt_len, prefix_hit);
        size_pools(&mut geometry, prompt_len, prefix_hit, allocation, pools);
    }
    // A partly filled last mamba group: only the first slots hold state.
    // Drawn last, and 0 (what an exhausted input gives) means every slot,
    // so that inputs saved before this draw existed decode as they did.
    let slots = geometry.model.layer_slots;
    if geometry.model.has_mamba() && slots > 1 {
        let without_state = u.int_in_range(0..=slots - 1)?;
        geometry.model.state_slots = (without_state > 0).then(|| slots - without_state);
    }
    Ok(GeneratedCase {
        geometry,
        prompt_len,
        prefix_hit,
        mode,
        allocation,
        seed,
        expected: Expected::Pass,
    })
}

const MAMBA_KINDS: [MambaKind; 4] = [
    MambaKind::Mamba1,
    MambaKind::Mamba2,
    MambaKind::Gdn,
    MambaKind::Kda,
];

/// One attention group and 1..=MAX_MAMBA_GROUPS mamba groups around it.
fn draw_groups(u: &mut Unstructured<'_>, shape: &Shape) -> Result<Vec<GroupKind>> {
    if shape.mamba.is_none() {
        return Ok(vec![GroupKind::Attention]);
    }
    let n = u.int_in_range(1..=MAX_MAMBA_GROUPS)? as usize;
    let at = u.int_in_range(0..=n)?;
    let mut groups = vec![GroupKind::Mamba; n];
    groups.insert(at, GroupKind::Attention);
    Ok(groups)
}

/// `(prefill, decode)` TP sizes.
fn draw_tp_sizes(u: &mut Unstructured<'_>, refusal: Option<Refusal>) -> Result<(u32, u32)> {
    match refusal {
        Some(Refusal::TpNotDivisible) => return pick(u, &NON_DIVISIBLE_TPS),
        Some(Refusal::GatheredReplicatedHeadsNhd) => return pick(u, &GATHERING_TPS),
        _ => {}
    }
    let small = pick(u, &TP_BASES)?;
    let mut factor = pick(u, &TP_FACTORS)?;
    let different = refusal.is_some_and(Refusal::needs_different_tp);
    if different && factor == 1 {
        factor = 2;
    }
    while small * factor > MAX_TP {
        factor /= 2;
    }
    let large = small * factor;
    let prefill_larger = match refusal.and_then(Refusal::needs_prefill_tp_larger) {
        Some(larger) => larger,
        None => u.arbitrary()?,
    };
    Ok(if prefill_larger {
        (large, small)
    } else {
        (small, large)
    })
}

/// Whether dense attention (no mamba) with `heads` KV heads avoids the
/// replicated-heads multi-read refusal: decode may not read replicated heads
/// from several prefill ranks (and in push prefill checks decode the same way).
fn replicated_multi_read_free(mode: Mode, p_tp: u32, d_tp: u32, heads: u32) -> bool {
    let decode_reads_replicas = p_tp > d_tp && p_tp > heads;
    let prefill_writes_replicas = mode == Mode::Push && d_tp > p_tp && d_tp > heads;
    !decode_reads_replicas && !prefill_writes_replicas
}

fn draw_attention(
    u: &mut Unstructured<'_>,
    shape: &Shape,
    mode: Mode,
    p_tp: u32,
    d_tp: u32,
    refusal: Option<Refusal>,
) -> Result<AttentionSpec> {
    let head_size = u.int_in_range(1..=MAX_HEAD_SIZE)?;
    let mut dtype_bytes = pick(u, &DTYPE_BYTES)?;
    if !shape.full {
        let head_size = head_size.min((MAX_TOKEN_BYTES / u64::from(dtype_bytes)) as u32);
        return Ok(AttentionSpec::Mla {
            head_size,
            dtype_bytes,
        });
    }
    let candidates: Vec<u32> = KV_HEADS
        .iter()
        .copied()
        .filter(|&h| heads_fit(h, p_tp) && heads_fit(h, d_tp))
        .filter(|&h| match refusal {
            Some(Refusal::TpNotDivisible) => true,
            Some(Refusal::ReplicatedKvMultiRead) => p_tp > h,
            Some(Refusal::GatheredReplicatedHeadsNhd) => {
                p_tp > h && multi_source_attention(p_tp, d_tp, h)
            }
            Some(
                Refusal::HeadSplitNeedsContiguousLayout
                | Refusal::RatioWithMultiRead
                | Refusal::HeadShardedWithRatio,
            ) => p_tp <= h,
            _ => shape.mamba.is_some() || replicated_multi_read_free(mode, p_tp, d_tp, h),
        })
        .collect();
    // Never empty: lcm(p_tp, d_tp) (valid) and 1 (replicated refusal) are listed.
    let total_kv_heads = pick(u, &candidates)?;
    let heads_per_rank = u64::from((total_kv_heads / p_tp.min(d_tp)).max(1));
    while 2 * heads_per_rank * u64::from(dtype_bytes) > MAX_TOKEN_BYTES && dtype_bytes > 1 {
        dtype_bytes /= 2;
    }
    let most = MAX_TOKEN_BYTES / (2 * heads_per_rank * u64::from(dtype_bytes));
    Ok(AttentionSpec::Full {
        total_kv_heads,
        head_size: head_size.min(most.max(1) as u32),
        dtype_bytes,
    })
}

fn draw_layout(u: &mut Unstructured<'_>) -> Result<KvLayout> {
    Ok(if u.arbitrary::<bool>()? {
        KvLayout::Hnd
    } else {
        KvLayout::Nhd
    })
}

/// `(prefill, decode)` layouts. MLA ignores the layout; full attention needs
/// equal layouts, and HND (block-contiguous heads) wherever a side splits
/// heads across different TP sizes.
fn draw_layouts(
    u: &mut Unstructured<'_>,
    shape: &Shape,
    p_tp: u32,
    d_tp: u32,
    heads: u32,
    refusal: Option<Refusal>,
) -> Result<(KvLayout, KvLayout)> {
    if !shape.full {
        return Ok((draw_layout(u)?, draw_layout(u)?));
    }
    match refusal {
        Some(Refusal::LayoutMismatch) => {
            let decode = draw_layout(u)?;
            let prefill = match decode {
                KvLayout::Nhd => KvLayout::Hnd,
                KvLayout::Hnd => KvLayout::Nhd,
            };
            return Ok((prefill, decode));
        }
        Some(Refusal::HeadSplitNeedsContiguousLayout | Refusal::GatheredReplicatedHeadsNhd) => {
            return Ok((KvLayout::Nhd, KvLayout::Nhd))
        }
        _ => {}
    }
    // Token-major (NHD) pages only where no rank slices or assembles heads:
    // equal TP sizes, or one replicated head on every rank of both engines
    // (assembling replicated heads is the refusal above).
    let nhd_allowed = p_tp == d_tp || (p_tp > heads && d_tp > heads);
    let layout = match draw_layout(u)? {
        KvLayout::Nhd if nhd_allowed => KvLayout::Nhd,
        _ => KvLayout::Hnd,
    };
    Ok((layout, layout))
}

/// Whether some decode rank reads its attention heads from more than one
/// prefill rank (prefill TP larger; the sources' heads sharded, or
/// replicated with more heads per decode rank than per prefill rank).
fn multi_source_attention(p_tp: u32, d_tp: u32, heads: u32) -> bool {
    if p_tp <= d_tp {
        return false;
    }
    let per_rank = p_tp / d_tp;
    (0..d_tp).any(|rank| {
        let mut sources: Vec<u32> = (rank * per_rank..(rank + 1) * per_rank)
            .map(|r| r * heads / p_tp)
            .collect();
        sources.dedup();
        sources.len() > 1
    })
}

/// `(prefill, decode)` kernel block sizes.
fn draw_kernels(
    u: &mut Unstructured<'_>,
    shape: &Shape,
    mode: Mode,
    p_tp: u32,
    d_tp: u32,
    heads: u32,
    refusal: Option<Refusal>,
) -> Result<(u32, u32)> {
    let base = u.int_in_range(1..=MAX_KERNEL_BASE)?;
    match refusal {
        Some(Refusal::BlockSizeNotDivisible) => {
            let factor = u.int_in_range(2..=MAX_PREFILL_KERNEL_FACTOR)?;
            return Ok((base * factor, base));
        }
        Some(
            Refusal::HostBufferWithRatio
            | Refusal::RatioWithMultiRead
            | Refusal::HeadShardedWithRatio,
        ) => {
            let ratio = pick(u, &KERNEL_RATIOS[1..])?;
            return Ok((base, base * ratio));
        }
        _ => {}
    }
    if shape.hybrid_mla() && u.arbitrary::<bool>()? {
        // Prefill's kernel larger: pull pairs it by gcd splitting; push
        // writes whole decode pages, so prefill's must be a multiple.
        let prefill = match mode {
            Mode::Pull => base + u.int_in_range(1..=base * (MAX_PREFILL_KERNEL_FACTOR - 1))?,
            Mode::Push => base * u.int_in_range(2..=MAX_PREFILL_KERNEL_FACTOR)?,
        };
        return Ok((prefill, base));
    }
    // Full attention read from several prefill ranks needs equal kernels:
    // dense models always, hybrids when the heads are split over the sources.
    let equal = shape.full
        && p_tp > d_tp
        && (shape.mamba.is_none() || multi_source_attention(p_tp, d_tp, heads));
    let ratio = if equal { 1 } else { pick(u, &KERNEL_RATIOS)? };
    Ok((base, base * ratio))
}

/// Padding bytes after every kernel page: none (most often), a few bytes, or
/// a whole page (an interleaved layout).
fn draw_padding(
    u: &mut Unstructured<'_>,
    attention: &AttentionSpec,
    engine: &EngineGeometry,
    forbidden: bool,
    required: bool,
) -> Result<u64> {
    let page = attention.bytes_per_token(engine.tp_size) * u64::from(engine.kernel_block);
    let choice = u.int_in_range(0..=3u8)?;
    if forbidden {
        return Ok(0);
    }
    Ok(match choice {
        2 => u.int_in_range(1..=page)?,
        3 => page,
        _ if required => page,
        _ => 0,
    })
}

/// A mamba spec whose sizes split evenly over both TP sizes; cut to its
/// smallest size when it would need a ppl above [`MAX_MAMBA_PPL`].
fn draw_mamba(
    u: &mut Unstructured<'_>,
    kind: MambaKind,
    model: &ModelSpec,
    prefill: &EngineGeometry,
    decode: &EngineGeometry,
) -> Result<MambaSpec> {
    let unit = lcm(prefill.tp_size, decode.tp_size);
    let mut units: Vec<u32> = (0..kind.num_conv_projections())
        .map(|_| u.int_in_range(1..=MAX_CONV_UNITS))
        .collect::<Result<_>>()?;
    match kind {
        MambaKind::Mamba2 => units[2] = units[1],
        MambaKind::Gdn => units[1] = units[0],
        MambaKind::Mamba1 | MambaKind::Kda => {}
    }
    // Mamba2 with one B/C group (Falcon-H1, Granite-4.0-H, Zamba2): every
    // rank at TP > 1 holds the whole group, so B and C need not split.
    let one_group = kind == MambaKind::Mamba2 && u.arbitrary::<bool>()?;
    let spec = |units: &[u32], rows, dtype, ssm_units: u64| MambaSpec {
        kind,
        conv_dims: units
            .iter()
            .enumerate()
            .map(|(j, c)| if one_group && j > 0 { *c } else { c * unit })
            .collect(),
        conv_rows: rows,
        conv_dtype_bytes: dtype,
        ssm_state_bytes: ssm_units * u64::from(unit),
        n_groups: one_group.then_some(1),
    };
    let rows = u.int_in_range(1..=MAX_CONV_ROWS)?;
    let dtype = pick(u, &DTYPE_BYTES)?;
    let ssm_units = u.int_in_range(1..=MAX_SSM_UNITS)?;
    let drawn = spec(&units, rows, dtype, ssm_units);
    let too_large = [prefill, decode]
        .iter()
        .any(|e| mamba_ppl(&drawn, model, e) > MAX_MAMBA_PPL as u32);
    if too_large {
        return Ok(spec(&vec![1; units.len()], 1, 1, 1));
    }
    Ok(drawn)
}

/// The smallest ppl whose page holds one rank's mamba state.
fn mamba_ppl(mamba: &MambaSpec, model: &ModelSpec, engine: &EngineGeometry) -> u32 {
    let kernel_page = engine.kernel_page_bytes(model);
    mamba
        .state_bytes(engine.tp_size)
        .div_ceil(kernel_page)
        .max(1) as u32
}

/// Host-buffer staging is refused with a kernel-block ratio on the side that
/// validates: decode always, prefill in push (where decode pages larger than
/// prefill's are viewed at prefill's size, ratio 1).
fn draw_host_buffers(
    u: &mut Unstructured<'_>,
    mode: Mode,
    prefill: &mut EngineGeometry,
    decode: &mut EngineGeometry,
    refusal: Option<Refusal>,
) -> Result<()> {
    let (p, d) = (prefill.kernel_block, decode.kernel_block);
    let decode_ratio_one = d == p || (d < p && p % d == 0);
    let prefill_ratio_one = mode == Mode::Pull || d >= p;
    let (want_prefill, want_decode) = (u.arbitrary::<bool>()?, u.arbitrary::<bool>()?);
    prefill.host_buffer = want_prefill && prefill_ratio_one;
    decode.host_buffer = if refusal == Some(Refusal::HostBufferWithRatio) {
        true
    } else {
        want_decode && decode_ratio_one
    };
    Ok(())
}

/// Prefix caching is refused on a validating side of a mamba hybrid whose
/// ppl differs from the one it sees remotely. Where it is wanted, decode's
/// ppl is aligned with prefill's when the mamba state still fits.
fn draw_prefix_caching(
    u: &mut Unstructured<'_>,
    mode: Mode,
    has_mamba: bool,
    split: u32,
    prefill: &mut EngineGeometry,
    decode: &mut EngineGeometry,
    refusal: Option<Refusal>,
) -> Result<()> {
    let (want_prefill, want_decode) = (u.arbitrary::<bool>()?, u.arbitrary::<bool>()?);
    if refusal == Some(Refusal::PrefixCachingHeteroPpl) {
        decode.prefix_caching = true;
        prefill.prefix_caching = want_prefill && mode == Mode::Pull;
        return Ok(());
    }
    if want_decode && has_mamba {
        let aligned = prefill.ppl() * split;
        if aligned >= decode.ppl() && aligned <= MAX_MAMBA_PPL as u32 {
            decode.logical_block = decode.kernel_block * aligned;
        }
    }
    decode.prefix_caching = want_decode && (!has_mamba || decode.ppl() == prefill.ppl() * split);
    // In push prefill sees decode pages larger than its own as sub-pages.
    let sub_pages = if decode.kernel_block > prefill.kernel_block {
        decode.kernel_block / prefill.kernel_block
    } else {
        1
    };
    let prefill_allowed =
        mode == Mode::Pull || !has_mamba || prefill.ppl() == decode.ppl() * sub_pages;
    prefill.prefix_caching = want_prefill && prefill_allowed;
    Ok(())
}

/// `Some(extra)` fixes a pool of the request's blocks plus `extra`.
fn draw_pool(u: &mut Unstructured<'_>) -> Result<Option<u32>> {
    Ok(if u.arbitrary::<bool>()? {
        Some(u.int_in_range(0..=MAX_EXTRA_POOL_BLOCKS)?)
    } else {
        None
    })
}

/// A prefix hit of whole decode blocks short of the transferred tokens,
/// only with prefix caching on decode.
fn prefix_hit(geometry: &Geometry, prompt_len: u32, hit_blocks: u32) -> u32 {
    if !geometry.decode.prefix_caching {
        return 0;
    }
    let block = geometry.decode.logical_block;
    let most = (geometry.transferred_tokens(prompt_len).saturating_sub(1)) / block;
    (hit_blocks % (most + 1)) * block
}

fn prefix_hit_clamped(geometry: &Geometry, prompt_len: u32, hit: u32) -> u32 {
    let block = geometry.decode.logical_block;
    prefix_hit(geometry, prompt_len, hit / block)
}

fn size_pools(
    geometry: &mut Geometry,
    prompt_len: u32,
    prefix_hit: u32,
    allocation: DecodeAllocation,
    [prefill_extra, decode_extra]: [Option<u32>; 2],
) {
    let shape = request_shape(geometry, prompt_len, prefix_hit, allocation);
    geometry.prefill.num_logical_blocks =
        prefill_extra.map(|e| shape.prefill_blocks.iter().sum::<u32>() + e);
    geometry.decode.num_logical_blocks =
        decode_extra.map(|e| shape.decode_blocks.iter().sum::<u32>() + e);
}

/// KV bytes the scenario allocates for the case over all ranks of both
/// engines (pools not fixed are sized as the placement sizes them).
pub(crate) fn case_bytes(
    geometry: &Geometry,
    prompt_len: u32,
    prefix_hit: u32,
    allocation: DecodeAllocation,
) -> u64 {
    let shape = request_shape(geometry, prompt_len, prefix_hit, allocation);
    let engine_bytes = |engine: &EngineGeometry, blocks: &[u32]| {
        let needed: u32 = blocks.iter().sum();
        let pool = engine.num_logical_blocks.unwrap_or((2 * needed + 4).max(8));
        u64::from(engine.tp_size)
            * u64::from(geometry.model.layer_slots)
            * u64::from(pool)
            * engine.unified_page_bytes(&geometry.model)
    };
    engine_bytes(&geometry.prefill, &shape.prefill_blocks)
        + engine_bytes(&geometry.decode, &shape.decode_blocks)
}
