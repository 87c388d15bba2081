//! Rules every geometry must satisfy before a scenario may use it.
//!
//! [`validate`] checks one [`Geometry`] and returns the first broken rule with
//! the dotted path of its field. Rules run in a fixed order (text fields,
//! model, engines, TP splits, page sizes, prompts), so a geometry always
//! reports the same error. Ratios between the two engines (tp ratio, kernel
//! block ratio) are deliberately not checked: the connector's handshake must
//! reject unsupported pairs itself, and a file declares that with
//! `expect_rejection`.
//!
//! All byte arithmetic runs in `u128`, so no input can overflow.

use std::collections::HashSet;

use super::engine::EngineGeometry;
use super::error::{Engine, Rule, Violation};
use super::model::{AttentionSpec, GroupKind, MambaKind, MambaSpec, ModelSpec};
use super::pair::Geometry;

use crate::limits::{MAX_LAYER_SLOTS, MAX_POOL_BLOCKS, MAX_PROMPT_LEN, MAX_TP_SIZE};
pub use crate::limits::{MAX_PAGE_BYTES, MAX_PROMPTS};

/// Check every rule; `Err` carries the first one broken.
pub fn validate(geometry: &Geometry) -> Result<(), Violation> {
    check_text(geometry)?;
    check_model(&geometry.model)?;
    let engines = [
        (Engine::Prefill, &geometry.prefill),
        (Engine::Decode, &geometry.decode),
    ];
    for (engine, geom) in engines {
        check_engine(engine, geom)?;
    }
    for (engine, geom) in engines {
        check_tp_split(&geometry.model, engine, geom.tp_size)?;
    }
    for (engine, geom) in engines {
        check_page(&geometry.model, engine, geom)?;
    }
    if let Some(prompts) = &geometry.prompts {
        check_prompts(prompts)?;
    }
    Ok(())
}

fn check_text(geometry: &Geometry) -> Result<(), Violation> {
    check_handshake(geometry)?;
    check_one_line("description", &geometry.description)?;
    let name = &geometry.name;
    if name.is_empty() {
        return Err(Violation::new("name", Rule::Empty));
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Err(Violation::new(
            "name",
            Rule::BadName {
                name: name.to_string(),
            },
        ));
    }
    if let Some(expected) = &geometry.expect_rejection {
        if let Some(text) = expected.in_both() {
            check_one_line("expect_rejection", text)?;
        } else {
            if expected.pull.is_none() && expected.push.is_none() {
                return Err(Violation::new("expect_rejection", Rule::NoRejectedMode));
            }
            for (mode, text) in [("pull", &expected.pull), ("push", &expected.push)] {
                if let Some(text) = text {
                    check_one_line(&format!("expect_rejection.{mode}"), text)?;
                }
            }
        }
    }
    Ok(())
}

/// Each engine's hashed settings are spelled as vLLM spells them.
fn check_handshake(geometry: &Geometry) -> Result<(), Violation> {
    use super::handshake_compat::{is_backend_name, is_cache_dtype_name};
    for (table, compat) in [
        ("prefill", &geometry.handshake.prefill),
        ("decode", &geometry.handshake.decode),
    ] {
        let spellings = [
            (
                "backend",
                &compat.backend,
                is_backend_name as fn(&str) -> bool,
                "an attention backend's name as vLLM spells it \
                 (`FLASHINFER`, `FLASH_ATTN`, `FLASHMLA`, ...)",
            ),
            (
                "kv_cache_dtype",
                &compat.kv_cache_dtype,
                is_cache_dtype_name,
                "a KV-cache dtype as vLLM spells it (`auto`, `fp8`, `fp8_e4m3`, ...)",
            ),
        ];
        for (key, value, spelled, expected) in spellings {
            if let Some(name) = value.as_ref().filter(|n| !spelled(n)) {
                return Err(Violation::new(
                    format!("{table}.{key}"),
                    Rule::BadSpelling {
                        found: name.clone(),
                        expected,
                    },
                ));
            }
        }
    }
    Ok(())
}

fn check_one_line(field: &str, text: &str) -> Result<(), Violation> {
    if text.trim().is_empty() {
        return Err(Violation::new(field, Rule::Empty));
    }
    if text.contains(['\n', '\r']) {
        return Err(Violation::new(field, Rule::MultiLine));
    }
    Ok(())
}

fn positive(field: impl Into<String>, value: u64) -> Result<(), Violation> {
    if value == 0 {
        return Err(Violation::new(field, Rule::NotPositive { found: 0 }));
    }
    Ok(())
}

/// `value` is at least 1 and at most `limit`.
fn bounded(field: impl Into<String>, value: u64, limit: u64) -> Result<(), Violation> {
    let field = field.into();
    positive(field.clone(), value)?;
    if value > limit {
        return Err(Violation::new(
            field,
            Rule::AboveLimit {
                found: value,
                limit,
            },
        ));
    }
    Ok(())
}

fn dtype(field: &str, bytes: u32) -> Result<(), Violation> {
    if !matches!(bytes, 1 | 2 | 4 | 8) {
        return Err(Violation::new(field, Rule::DtypeBytes { found: bytes }));
    }
    Ok(())
}

fn check_model(model: &ModelSpec) -> Result<(), Violation> {
    bounded(
        "model.layer_slots",
        model.layer_slots.into(),
        MAX_LAYER_SLOTS.into(),
    )?;
    if model.groups.is_empty() {
        return Err(Violation::new("model.groups", Rule::NoGroups));
    }
    let uses = |kind| model.groups.contains(&kind);
    if let Some(n) = model.state_slots {
        const FIELD: &str = "model.state_slots";
        if !uses(GroupKind::Mamba) {
            return Err(Violation::new(FIELD, Rule::StateSlotsWithoutMamba));
        }
        positive(FIELD, n.into())?;
        if n > model.layer_slots {
            return Err(Violation::new(
                FIELD,
                Rule::StateSlotsAboveLayerSlots {
                    found: n,
                    layer_slots: model.layer_slots,
                },
            ));
        }
    }
    for (kind, given, field) in [
        (
            GroupKind::Attention,
            model.attention.is_some(),
            "model.attention",
        ),
        (GroupKind::Mamba, model.mamba.is_some(), "model.mamba"),
    ] {
        match (uses(kind), given) {
            (true, false) => return Err(Violation::new(field, Rule::MissingSpec { kind })),
            (false, true) => return Err(Violation::new(field, Rule::UnusedSpec { kind })),
            _ => {}
        }
    }
    if uses(GroupKind::Mamba) && !uses(GroupKind::Attention) {
        return Err(Violation::new("model.groups", Rule::MambaWithoutAttention));
    }
    if let Some(attention) = &model.attention {
        check_attention(attention)?;
    }
    if let Some(mamba) = &model.mamba {
        check_mamba(mamba)?;
    }
    Ok(())
}

fn check_attention(attention: &AttentionSpec) -> Result<(), Violation> {
    let (head_size, dtype_bytes) = match attention {
        AttentionSpec::Mla {
            head_size,
            dtype_bytes,
        } => (*head_size, *dtype_bytes),
        AttentionSpec::Full {
            total_kv_heads,
            head_size,
            dtype_bytes,
        } => {
            positive("model.attention.total_kv_heads", (*total_kv_heads).into())?;
            (*head_size, *dtype_bytes)
        }
    };
    positive("model.attention.head_size", head_size.into())?;
    dtype("model.attention.dtype_bytes", dtype_bytes)
}

fn check_mamba(mamba: &MambaSpec) -> Result<(), Violation> {
    let expected = mamba.kind.num_conv_projections();
    if mamba.conv_dims.len() != expected {
        return Err(Violation::new(
            "model.mamba.conv_dims",
            Rule::ConvDimsCount {
                kind: mamba.kind,
                expected,
                found: mamba.conv_dims.len(),
            },
        ));
    }
    for (i, dim) in mamba.conv_dims.iter().enumerate() {
        positive(format!("model.mamba.conv_dims[{i}]"), (*dim).into())?;
    }
    let equal_pair = match mamba.kind {
        MambaKind::Mamba2 => Some((1, 2)),
        MambaKind::Gdn => Some((0, 1)),
        MambaKind::Mamba1 | MambaKind::Kda => None,
    };
    if let Some((a, b)) = equal_pair {
        let (first, second) = (mamba.conv_dims[a], mamba.conv_dims[b]);
        if first != second {
            return Err(Violation::new(
                format!("model.mamba.conv_dims[{b}]"),
                Rule::UnequalConvPair {
                    kind: mamba.kind,
                    first,
                    second,
                },
            ));
        }
    }
    positive("model.mamba.conv_rows", mamba.conv_rows.into())?;
    dtype("model.mamba.conv_dtype_bytes", mamba.conv_dtype_bytes)?;
    positive("model.mamba.ssm_state_bytes", mamba.ssm_state_bytes)?;
    if let Some(groups) = mamba.n_groups {
        const FIELD: &str = "model.mamba.n_groups";
        if mamba.kind != MambaKind::Mamba2 {
            return Err(Violation::new(
                FIELD,
                Rule::GroupsNotMamba2 { kind: mamba.kind },
            ));
        }
        positive(FIELD, groups.into())?;
        let channels = mamba.conv_dims[1];
        if channels % groups != 0 {
            return Err(Violation::new(
                "model.mamba.conv_dims[1]",
                Rule::GroupsDoNotSplitChannels { channels, groups },
            ));
        }
    }
    Ok(())
}

fn check_engine(engine: Engine, geom: &EngineGeometry) -> Result<(), Violation> {
    let field = |name: &str| format!("{engine}.{name}");
    bounded(field("tp_size"), geom.tp_size.into(), MAX_TP_SIZE.into())?;
    positive(field("kernel_block"), geom.kernel_block.into())?;
    positive(field("logical_block"), geom.logical_block.into())?;
    if let Some(blocks) = geom.num_logical_blocks {
        bounded(
            field("num_logical_blocks"),
            blocks.into(),
            MAX_POOL_BLOCKS.into(),
        )?;
    }
    if geom.logical_block % geom.kernel_block != 0 {
        return Err(Violation::new(
            field("kernel_block"),
            Rule::KernelDoesNotDivideLogical {
                kernel: geom.kernel_block,
                logical: geom.logical_block,
            },
        ));
    }
    Ok(())
}

/// Sizes that vLLM shards across TP ranks must split evenly.
fn check_tp_split(model: &ModelSpec, engine: Engine, tp: u32) -> Result<(), Violation> {
    if let Some(AttentionSpec::Full { total_kv_heads, .. }) = &model.attention {
        let heads = *total_kv_heads;
        if heads % tp != 0 && tp % heads != 0 {
            return Err(Violation::new(
                "model.attention.total_kv_heads",
                Rule::KvHeadsVsTp { heads, engine, tp },
            ));
        }
    }
    if let Some(mamba) = &model.mamba {
        if let Some(groups) = mamba.n_groups {
            if groups % tp != 0 && groups != 1 {
                return Err(Violation::new(
                    "model.mamba.n_groups",
                    Rule::GroupsVsTp { groups, engine, tp },
                ));
            }
        }
        for (i, dim) in mamba.conv_dims.iter().enumerate() {
            // Replicated groups: every rank holds whole groups, nothing is split.
            if dim % tp != 0 && !mamba.is_replicated(i, tp) {
                return Err(Violation::new(
                    format!("model.mamba.conv_dims[{i}]"),
                    Rule::NotSplitOverTp {
                        value: (*dim).into(),
                        what: "conv channels",
                        engine,
                        tp,
                    },
                ));
            }
        }
        if mamba.ssm_state_bytes % u64::from(tp) != 0 {
            return Err(Violation::new(
                "model.mamba.ssm_state_bytes",
                Rule::NotSplitOverTp {
                    value: mamba.ssm_state_bytes,
                    what: "SSM state bytes",
                    engine,
                    tp,
                },
            ));
        }
    }
    Ok(())
}

/// Attention bytes of one token on one rank (heads clamp at one per rank).
fn attention_bytes_per_token(attention: &AttentionSpec, tp: u32) -> u128 {
    let (heads, head_size, dtype_bytes, kv_factor) = match attention {
        AttentionSpec::Mla {
            head_size,
            dtype_bytes,
        } => (1, *head_size, *dtype_bytes, 1),
        AttentionSpec::Full {
            total_kv_heads,
            head_size,
            dtype_bytes,
        } => ((total_kv_heads / tp).max(1), *head_size, *dtype_bytes, 2),
    };
    u128::from(heads) * u128::from(head_size) * u128::from(dtype_bytes) * kv_factor
}

/// `(conv, ssm)` state bytes of one rank.
fn mamba_state_bytes(mamba: &MambaSpec, tp: u32) -> (u128, u128) {
    let channels: u128 = (0..mamba.conv_dims.len())
        .map(|j| u128::from(mamba.rank_channels(j, tp)))
        .sum();
    let conv = channels * u128::from(mamba.conv_rows) * u128::from(mamba.conv_dtype_bytes);
    let ssm = u128::from(mamba.ssm_state_bytes / u64::from(tp));
    (conv, ssm)
}

fn check_page(model: &ModelSpec, engine: Engine, geom: &EngineGeometry) -> Result<(), Violation> {
    let Some(attention) = &model.attention else {
        return Ok(());
    };
    let field = format!("{engine}.logical_block");
    let per_token = attention_bytes_per_token(attention, geom.tp_size);
    let page = per_token * u128::from(geom.logical_block);
    // What one logical block occupies, with every kernel page's padding.
    let padded = page + u128::from(geom.block_padding_bytes) * u128::from(geom.ppl());
    if padded > u128::from(MAX_PAGE_BYTES) {
        let field = if page > u128::from(MAX_PAGE_BYTES) {
            field
        } else {
            format!("{engine}.block_padding_bytes")
        };
        return Err(Violation::new(
            field,
            Rule::PageTooLarge {
                bytes: padded,
                limit: MAX_PAGE_BYTES,
            },
        ));
    }
    if let Some(mamba) = &model.mamba {
        let (conv, ssm) = mamba_state_bytes(mamba, geom.tp_size);
        if conv + ssm > page {
            let kernel_page = per_token * u128::from(geom.kernel_block);
            let min_logical = (conv + ssm).div_ceil(kernel_page) * u128::from(geom.kernel_block);
            return Err(Violation::new(
                field,
                Rule::MambaStateExceedsPage {
                    tp: geom.tp_size,
                    conv: saturate(conv),
                    ssm: saturate(ssm),
                    page: saturate(page),
                    logical: geom.logical_block,
                    per_token: saturate(per_token),
                    min_logical: saturate(min_logical),
                },
            ));
        }
    }
    Ok(())
}

/// For messages: values past `u64::MAX` only come from absurd inputs.
fn saturate(value: u128) -> u64 {
    u64::try_from(value).unwrap_or(u64::MAX)
}

/// `count` prompt lengths are within [`MAX_PROMPTS`].
pub(super) fn prompt_count_within(count: u64) -> Result<(), Violation> {
    if count > MAX_PROMPTS {
        return Err(Violation::new(
            "prompts",
            Rule::TooManyPrompts {
                count,
                limit: MAX_PROMPTS,
            },
        ));
    }
    Ok(())
}

fn check_prompts(prompts: &[u32]) -> Result<(), Violation> {
    if prompts.is_empty() {
        return Err(Violation::new("prompts", Rule::NoPrompts));
    }
    prompt_count_within(prompts.len() as u64)?;
    let mut seen = HashSet::with_capacity(prompts.len());
    for (i, &length) in prompts.iter().enumerate() {
        bounded(
            format!("prompts[{i}]"),
            length.into(),
            MAX_PROMPT_LEN.into(),
        )?;
        if !seen.insert(length) {
            return Err(Violation::new(
                format!("prompts[{i}]"),
                Rule::DuplicatePrompt { length },
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::geometry::fixtures::g1;

    fn engine(tp_size: u32, kernel_block: u32, logical_block: u32) -> EngineGeometry {
        EngineGeometry::new(tp_size, kernel_block, logical_block)
    }

    #[test]
    fn g1_is_valid() {
        assert_eq!(validate(&g1()), Ok(()));
    }

    #[test]
    fn state_bytes_follow_tp() {
        let mamba = g1().model.mamba.unwrap();
        assert_eq!(mamba_state_bytes(&mamba, 1), (48, 64));
        assert_eq!(mamba_state_bytes(&mamba, 2), (24, 32));
    }

    #[test]
    fn gqa_heads_clamp_at_one_per_rank() {
        let gqa = AttentionSpec::Full {
            total_kv_heads: 2,
            head_size: 8,
            dtype_bytes: 2,
        };
        assert_eq!(attention_bytes_per_token(&gqa, 1), 64);
        assert_eq!(attention_bytes_per_token(&gqa, 2), 32);
        assert_eq!(attention_bytes_per_token(&gqa, 4), 32);
    }

    #[test]
    fn state_that_overflows_the_page_names_both_sizes_and_the_fix() {
        let mut g = g1();
        g.prefill.logical_block = 4;
        let err = validate(&g).unwrap_err();
        assert_eq!(err.field, "prefill.logical_block");
        assert_eq!(
            err.rule,
            Rule::MambaStateExceedsPage {
                tp: 2,
                conv: 24,
                ssm: 32,
                page: 48,
                logical: 4,
                per_token: 12,
                min_logical: 8,
            }
        );
        assert_eq!(
            err.to_string(),
            "prefill.logical_block: one rank's mamba state at TP 2 (conv 24 + SSM 32 = 56 bytes) \
             does not fit the padded page of 48 bytes (logical block 4 x 12 attention bytes per \
             token); the logical block must be at least 8 tokens"
        );
    }

    #[test]
    fn a_state_exactly_filling_the_page_is_accepted() {
        let mut g = g1();
        g.model.mamba.as_mut().unwrap().ssm_state_bytes = 48;
        g.prefill.logical_block = 4;
        assert_eq!(validate(&g), Ok(()));
    }

    #[test]
    fn huge_sizes_are_rejected_without_overflow() {
        let mut g = g1();
        g.model.attention = Some(AttentionSpec::Full {
            total_kv_heads: u32::MAX,
            head_size: u32::MAX,
            dtype_bytes: 8,
        });
        g.prefill = engine(1, u32::MAX, u32::MAX);
        let err = validate(&g).unwrap_err();
        assert_eq!(err.field, "prefill.logical_block");
        assert!(matches!(err.rule, Rule::PageTooLarge { .. }), "{err}");
    }

    #[test]
    fn the_first_broken_rule_wins() {
        let mut g = g1();
        g.decode.kernel_block = 5;
        g.prompts = Some(vec![0]);
        let err = validate(&g).unwrap_err();
        assert_eq!(err.field, "decode.kernel_block");
    }

    #[test]
    fn duplicate_prompt_is_named_by_its_index() {
        let mut g = g1();
        g.prompts = Some(vec![3, 4, 3]);
        let err = validate(&g).unwrap_err();
        assert_eq!(err.field, "prompts[2]");
        assert_eq!(err.rule, Rule::DuplicatePrompt { length: 3 });
    }
}
