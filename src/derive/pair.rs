//! A prefill/decode pair derived from one model config: both engines, the
//! KV-cache groups, and the geometry file kvgeom sweeps.

use crate::geometry::{
    AttentionSpec, EngineGeometry, Geometry, GroupKind, KvLayout, MambaKind, MambaSpec, ModelSpec,
};

use super::engine::{derive_engine, EngineDerivation, EngineOptions};
use super::error::DeriveError;
use super::families::{MambaArch, ModelArch};

/// What `derivation`'s engine hashes at the handshake, as its file states it.
fn engine_compat(derivation: &EngineDerivation) -> crate::geometry::EngineCompat {
    crate::geometry::EngineCompat {
        backend: Some(derivation.backend.to_string()),
        kv_cache_dtype: Some(derivation.cache_dtype.to_string()),
    }
}

/// Both engines' options and what the geometry file should hold besides.
#[derive(Clone, Debug)]
pub struct PairOptions {
    /// The prefill (P) engine's options.
    pub prefill: EngineOptions,
    /// The decode (D) engine's options.
    pub decode: EngineOptions,
    /// Layer slots (shared tensors) to model; default: vLLM's group size.
    pub layer_slots: Option<u32>,
    /// `enforce_handshake_compat` (vLLM's default: on); off looks past a
    /// compatibility-hash mismatch to the geometry rules and the bytes.
    pub enforce_handshake_compat: bool,
}

/// vLLM 0.33.0's KV-cache grouping for a hybrid model
/// (`_get_kv_cache_groups_uniform_page_size`): every group holds at most
/// `group_size` layers, the smaller layer count of the two kinds, or the
/// larger when it is below 1.5 times the smaller; each kind fills
/// `ceil(layers / group_size)` groups, group `i` taking every
/// `groups`-th layer from layer `i`, the kinds in the order of their first
/// layer. Layer `l` of every group overlays layer slot `l`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerGroups {
    /// Layers per KV-cache group at most (also the default layer slots).
    pub group_size: u64,
    /// The kind of each group, in vLLM's order.
    pub groups: Vec<GroupKind>,
    /// The layers each group holds (fewer than `group_size` in a partly
    /// filled group), in the order of `groups`.
    pub layers_per_group: Vec<u64>,
    /// Layers per kind, to say how full the groups of each kind are.
    pub attention_layers: u64,
    /// Layers with mamba state.
    pub mamba_layers: u64,
}

impl LayerGroups {
    /// The layer slots (from slot 0) that hold a layer of `kind`: those of
    /// its fullest group.
    pub fn slots_of(&self, kind: GroupKind) -> u64 {
        self.groups
            .iter()
            .zip(&self.layers_per_group)
            .filter(|(k, _)| **k == kind)
            .map(|(_, n)| *n)
            .max()
            .unwrap_or(0)
    }
}

/// `layers` of one kind in groups of at most `size`: the layers of each group.
fn fill(layers: u64, size: u64) -> Vec<u64> {
    let groups = layers.div_ceil(size);
    (0..groups).map(|i| (layers - i).div_ceil(groups)).collect()
}

/// The KV-cache groups of a model with `attention` and `mamba` layers, the
/// mamba layers first when `mamba_first`.
pub fn layer_groups_of(attention: u64, mamba: u64, mamba_first: bool) -> LayerGroups {
    let (a, m) = (attention, mamba);
    if m == 0 || a == 0 {
        let kind = if a > 0 {
            GroupKind::Attention
        } else {
            GroupKind::Mamba
        };
        let size = a.max(m).max(1);
        return LayerGroups {
            group_size: size,
            groups: vec![kind],
            layers_per_group: vec![size],
            attention_layers: a,
            mamba_layers: m,
        };
    }
    let (min, max) = (a.min(m), a.max(m));
    // max < 1.5 * min, in integers.
    let group_size = if 2 * max < 3 * min { max } else { min };
    let attention = fill(a, group_size);
    let mamba = fill(m, group_size);
    let kinds = |kind, n: &Vec<u64>| vec![kind; n.len()];
    let (groups, layers_per_group) = if mamba_first {
        (
            [
                kinds(GroupKind::Mamba, &mamba),
                kinds(GroupKind::Attention, &attention),
            ]
            .concat(),
            [mamba, attention].concat(),
        )
    } else {
        (
            [
                kinds(GroupKind::Attention, &attention),
                kinds(GroupKind::Mamba, &mamba),
            ]
            .concat(),
            [attention, mamba].concat(),
        )
    };
    LayerGroups {
        group_size,
        groups,
        layers_per_group,
        attention_layers: a,
        mamba_layers: m,
    }
}

/// The KV-cache groups of `model`; a model with one kind of layer has one
/// group of all its layers.
pub fn layer_groups(model: &ModelArch) -> LayerGroups {
    let mamba = if model.mamba.is_some() {
        model.mamba_layers
    } else {
        0
    };
    layer_groups_of(model.attention_layers, mamba, model.mamba_first)
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

/// Whether the engine replicates its Mamba2 groups (TP does not divide them).
fn replicates_groups(e: &EngineDerivation, model: &ModelArch) -> bool {
    match (&e.mamba, &model.mamba) {
        (Some(state), Some(MambaArch::Mamba2 { n_groups, .. })) => {
            state.groups_after_replication != Some(*n_groups)
        }
        _ => false,
    }
}

/// The mamba table of the file: channel totals over TP, as the format
/// requires (one rank holds `total / tp`). With `groups` (a pair where an
/// engine replicates Mamba2 groups), B and C are the model's `n_groups x
/// state size` channels and `n_groups` is stated, so that each engine's
/// per-rank widths follow from its own TP.
fn mamba_spec(
    e: &EngineDerivation,
    model: &ModelArch,
    groups: bool,
) -> Result<Option<MambaSpec>, DeriveError> {
    let Some(m) = &e.mamba else { return Ok(None) };
    let kind = match m.kind {
        "mamba1" => MambaKind::Mamba1,
        "mamba2" => MambaKind::Mamba2,
        "gdn" => MambaKind::Gdn,
        _ => MambaKind::Kda,
    };
    let mut conv_dims = m
        .conv_split
        .iter()
        .map(|c| u32_of(c * e.tp, "conv channels"))
        .collect::<Result<Vec<_>, _>>()?;
    let mut n_groups = None;
    if let (
        true,
        Some(MambaArch::Mamba2 {
            n_groups: g,
            state_size,
            ..
        }),
    ) = (groups, &model.mamba)
    {
        let bc = u32_of(g * state_size, "B/C channels")?;
        conv_dims[1] = bc;
        conv_dims[2] = bc;
        n_groups = Some(u32_of(*g, "Mamba2 groups")?);
    }
    Ok(Some(MambaSpec {
        kind,
        conv_dims,
        conv_rows: u32_of(m.conv_shape[1], "conv rows")?,
        conv_dtype_bytes: if m.conv_dtype == "float32" { 4 } else { 2 },
        ssm_state_bytes: m.ssm_bytes * e.tp,
        n_groups,
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
/// the model (attention, mamba state), or when `--layer-slots` is 0 or more
/// than the slots that hold a mamba layer.
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
    // Replicated Mamba2 groups: the file states n_groups, and B and C as the
    // model's channels, so that each engine's widths follow from its TP.
    let replicated = replicates_groups(&prefill, model) || replicates_groups(&decode, model);
    let p_mamba = mamba_spec(&prefill, model, replicated)?;
    let p_mamba = same(
        "mamba state",
        p_mamba,
        mamba_spec(&decode, model, replicated)?,
    )?;
    let mla = attention.is_mla();
    // vLLM registers state only in the slots holding a mamba layer
    // (`_ssm_region_indices`); attention covers every slot in vLLM's lists
    // whether or not a layer uses it. `--layer-slots n` models the first n.
    let mamba_slots = groups.slots_of(GroupKind::Mamba);
    let layer_slots = match options.layer_slots {
        Some(0) => {
            return Err(DeriveError::ZeroOption {
                option: "--layer-slots",
            })
        }
        Some(n) if u64::from(n) > groups.group_size => {
            return Err(DeriveError::Unsupported(format!(
                "--layer-slots {n}: vLLM 0.33.0 gives this model {} layer slots ({} attention + {} mamba \
                 layers in groups of {}); at most {} can be modelled",
                groups.group_size,
                groups.attention_layers,
                groups.mamba_layers,
                groups.group_size,
                groups.group_size
            )))
        }
        Some(n) => n,
        None => u32_of(groups.group_size, "layer slots")?,
    };
    let state_slots =
        if groups.groups.contains(&GroupKind::Mamba) && mamba_slots < u64::from(layer_slots) {
            Some(u32_of(mamba_slots, "state slots")?)
        } else {
            None
        };
    let geometry = Geometry {
        name: String::new(),
        description: String::new(),
        model: ModelSpec {
            attention: Some(attention),
            mamba: p_mamba,
            groups: groups.groups.clone(),
            layer_slots,
            state_slots,
        },
        prefill: engine_geometry(&prefill, mla)?,
        decode: engine_geometry(&decode, mla)?,
        prompts: None,
        expect_rejection: None,
        stack: crate::geometry::Stack::Vllm,
        // What each engine hashes at the handshake: a pair whose backends or
        // cache dtypes differ is refused there while the check is on.
        handshake: crate::geometry::HandshakeCompat {
            prefill: engine_compat(&prefill),
            decode: engine_compat(&decode),
            enforce: options.enforce_handshake_compat,
        },
        sglang: None,
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

    #[test]
    fn groups_take_every_nth_layer_so_a_kind_may_miss_slots() {
        use GroupKind::{Attention as A, Mamba as M};
        // 20 KDA layers in groups of 7: 7, 7, 6; every slot holds one.
        let k = layer_groups_of(7, 20, true);
        assert_eq!(k.layers_per_group, [7, 7, 6, 7]);
        assert_eq!((k.slots_of(M), k.slots_of(A)), (7, 7));
        // 15 in groups of 7: three groups of 5, so slots 5 and 6 hold no mamba layer.
        let s = layer_groups_of(7, 15, true);
        assert_eq!(s.slots_of(M), 5);
        assert_eq!(
            (s.groups, s.layers_per_group),
            (vec![M, M, M, A], vec![5, 5, 5, 7])
        );
        // 13 attention and 20 mamba layers: groups of 13, the mamba ones of 10.
        let t = layer_groups_of(13, 20, false);
        assert_eq!(t.layers_per_group, [13, 10, 10]);
    }
}
