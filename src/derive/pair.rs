//! A prefill/decode pair derived from one model config: both engines, the
//! KV-cache groups, and the geometry file kvgeom sweeps.

use crate::geometry::{
    AttentionSpec, EngineGeometry, Geometry, GroupKind, KvLayout, MambaKind, MambaSpec, ModelSpec,
};

use super::engine::{derive_engine, EngineDerivation, EngineOptions};
use super::error::DeriveError;
use super::families::ModelArch;

/// Both engines' options and what the geometry file should hold besides.
#[derive(Clone, Debug)]
pub struct PairOptions {
    /// The prefill (P) engine's options.
    pub prefill: EngineOptions,
    /// The decode (D) engine's options.
    pub decode: EngineOptions,
    /// Layer slots (shared tensors) to model; default: vLLM's group size.
    pub layer_slots: Option<u32>,
}

/// vLLM 0.33.0's KV-cache grouping for a hybrid model
/// (`_get_kv_cache_groups_uniform_page_size`): every group holds
/// `group_size` layers, the smaller layer count of the two kinds, or the
/// larger when it is below 1.5 times the smaller; each kind fills
/// `ceil(layers / group_size)` groups (the last may be partly filled), the
/// kinds in the order of their first layer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerGroups {
    /// Layers per KV-cache group (also the default layer slots).
    pub group_size: u64,
    /// The kind of each group, in vLLM's order.
    pub groups: Vec<GroupKind>,
    /// Layers per kind, to say how full the last group of each kind is.
    pub attention_layers: u64,
    /// Layers with mamba state.
    pub mamba_layers: u64,
}

/// The KV-cache groups of `model`; a model with one kind of layer has one
/// group of all its layers.
pub fn layer_groups(model: &ModelArch) -> LayerGroups {
    let (a, m) = (model.attention_layers, model.mamba_layers);
    if model.mamba.is_none() || m == 0 || a == 0 {
        let kind = if a > 0 {
            GroupKind::Attention
        } else {
            GroupKind::Mamba
        };
        return LayerGroups {
            group_size: a.max(m).max(1),
            groups: vec![kind],
            attention_layers: a,
            mamba_layers: m,
        };
    }
    let (min, max) = (a.min(m), a.max(m));
    // max < 1.5 * min, in integers.
    let group_size = if 2 * max < 3 * min { max } else { min };
    let attention = vec![GroupKind::Attention; a.div_ceil(group_size) as usize];
    let mamba = vec![GroupKind::Mamba; m.div_ceil(group_size) as usize];
    let groups = if model.mamba_first {
        [mamba, attention].concat()
    } else {
        [attention, mamba].concat()
    };
    LayerGroups {
        group_size,
        groups,
        attention_layers: a,
        mamba_layers: m,
    }
}

/// A derived pair: both engines and the geometry.
#[derive(Clone, Debug)]
pub struct PairDerivation {
    /// The prefill engine.
    pub prefill: EngineDerivation,
    /// The decode engine.
    pub decode: EngineDerivation,
    /// The model's KV-cache groups.
    pub groups: LayerGroups,
    /// The geometry file for the pair (name and description left empty).
    pub geometry: Geometry,
}

fn u32_of(value: u64, what: &str) -> Result<u32, DeriveError> {
    u32::try_from(value).map_err(|_| {
        DeriveError::Unsupported(format!("{what} {value} does not fit a geometry file"))
    })
}

/// Both engines must agree on what a geometry file states once for the model.
fn same<T: PartialEq + std::fmt::Debug>(what: &str, p: T, d: T) -> Result<T, DeriveError> {
    if p == d {
        Ok(p)
    } else {
        Err(DeriveError::Unsupported(format!(
            "prefill and decode differ in {what} ({p:?} vs {d:?}); a geometry file states it once for the model"
        )))
    }
}

fn attention_spec(e: &EngineDerivation) -> Result<AttentionSpec, DeriveError> {
    let head_size = u32_of(e.attention.head_size, "head size")?;
    let dtype_bytes = u32_of(e.attention.dtype_bytes, "dtype bytes")?;
    Ok(if e.attention.kind == "mla" {
        AttentionSpec::Mla {
            head_size,
            dtype_bytes,
        }
    } else {
        AttentionSpec::Full {
            total_kv_heads: u32_of(e.attention.total_kv_heads, "KV heads")?,
            head_size,
            dtype_bytes,
        }
    })
}

/// The mamba table of the file: channel totals over TP, as the format
/// requires (one rank holds `total / tp`).
fn mamba_spec(e: &EngineDerivation) -> Result<Option<MambaSpec>, DeriveError> {
    let Some(m) = &e.mamba else { return Ok(None) };
    let kind = match m.kind {
        "mamba1" => MambaKind::Mamba1,
        "mamba2" => MambaKind::Mamba2,
        "gdn" => MambaKind::Gdn,
        _ => MambaKind::Kda,
    };
    let conv_dims = m
        .conv_split
        .iter()
        .map(|c| u32_of(c * e.tp, "conv channels"))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Some(MambaSpec {
        kind,
        conv_dims,
        conv_rows: u32_of(m.conv_shape[1], "conv rows")?,
        conv_dtype_bytes: if m.conv_dtype == "float32" { 4 } else { 2 },
        ssm_state_bytes: m.ssm_bytes * e.tp,
    }))
}

fn engine_geometry(e: &EngineDerivation, mla: bool) -> Result<EngineGeometry, DeriveError> {
    Ok(EngineGeometry {
        tp_size: u32_of(e.tp, "TP")?,
        kernel_block: u32_of(e.kernel_block, "kernel block")?,
        logical_block: u32_of(e.logical_block, "logical block")?,
        num_logical_blocks: None,
        // The NIXL connector asks for LBHNC (HND) unless the model is MLA.
        layout: if mla { KvLayout::Nhd } else { KvLayout::Hnd },
        host_buffer: false,
        prefix_caching: false,
        block_padding_bytes: 0,
    })
}

/// Derive both engines and the geometry file for the pair. Fails when an
/// engine fails, when the engines disagree on what the file states once for
/// the model (attention, mamba state), when Mamba2 groups are replicated
/// differently at the two TP sizes, or when `--layer-slots` is 0.
pub fn derive_pair(
    model: &ModelArch,
    options: &PairOptions,
) -> Result<PairDerivation, DeriveError> {
    let prefill = derive_engine(model, &options.prefill)?;
    let decode = derive_engine(model, &options.decode)?;
    let groups = layer_groups(model);
    let attention = same(
        "attention",
        attention_spec(&prefill)?,
        attention_spec(&decode)?,
    )?;
    let (p_mamba, d_mamba) = (mamba_spec(&prefill)?, mamba_spec(&decode)?);
    if p_mamba != d_mamba {
        let (p, d) = (prefill.mamba.as_ref(), decode.mamba.as_ref());
        let replicated = p.and_then(|s| s.groups_after_replication)
            != d.and_then(|s| s.groups_after_replication);
        if replicated {
            return Err(DeriveError::Unsupported(format!(
                "Mamba2 groups are replicated differently on the two engines (prefill TP {} holds {} conv channels per rank, \
                 decode TP {} holds {}), so per-rank conv widths cannot be derived from one total over TP: \
                 the geometry format cannot state this pair yet",
                prefill.tp,
                p.map_or(0, |s| s.conv_shape[0]),
                decode.tp,
                d.map_or(0, |s| s.conv_shape[0]),
            )));
        }
        same("mamba state", p_mamba.clone(), d_mamba)?;
    }
    let mla = attention.is_mla();
    let layer_slots = match options.layer_slots {
        Some(0) => {
            return Err(DeriveError::ZeroOption {
                option: "--layer-slots",
            })
        }
        Some(n) => n,
        None => u32_of(groups.group_size, "layer slots")?,
    };
    let geometry = Geometry {
        name: String::new(),
        description: String::new(),
        model: ModelSpec {
            attention: Some(attention),
            mamba: p_mamba,
            groups: groups.groups.clone(),
            layer_slots,
        },
        prefill: engine_geometry(&prefill, mla)?,
        decode: engine_geometry(&decode, mla)?,
        prompts: None,
        expect_rejection: None,
    };
    Ok(PairDerivation {
        prefill,
        decode,
        groups,
        geometry,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::derive::HfConfig;

    fn groups_of(file: &str) -> LayerGroups {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/models")
            .join(file);
        layer_groups(
            &ModelArch::from_config(&HfConfig::load(&path).expect("loads")).expect("model"),
        )
    }

    #[test]
    fn kv_cache_groups_follow_vllm_grouping() {
        use GroupKind::{Attention as A, Mamba as M};
        // 12 full attention + 36 GDN layers: groups of 12, GDN first.
        let q = groups_of("qwen3-next-80b-a3b.json");
        assert_eq!((q.group_size, q.groups), (12, vec![M, M, M, A]));
        // 4 attention + 28 Mamba1 layers: groups of 4.
        let j = groups_of("jamba-1.5-mini.json");
        assert_eq!((j.group_size, j.groups.len()), (4, 8));
        // 7 MLA + 20 KDA layers: groups of 7, the last KDA group partly filled.
        let k = groups_of("kimi-linear-48b-a3b.json");
        assert_eq!((k.group_size, k.groups), (7, vec![M, M, M, A]));
        // Attention and Mamba2 in every layer: one group each, attention first.
        let f = groups_of("falcon-h1-7b.json");
        assert_eq!((f.group_size, f.groups), (44, vec![A, M]));
        // Pure MLA: one group of all layers.
        let d = groups_of("deepseek-v3.json");
        assert_eq!((d.group_size, d.groups), (61, vec![A]));
    }
}
