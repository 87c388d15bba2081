//! A P/D pair under SGLang 0.5.23 as an SGLang geometry file (`stack =
//! "sglang"`, docs/geometry-format.md), which `kvgeom sweep --connector
//! sglang` runs.
//!
//! The format gives each layer one kind: the layers `[model.state]` lists
//! keep a linear state, the others attention KV. Layers with neither (MLP
//! only) are left out, and a layer with both (Falcon-H1) becomes an
//! attention layer followed by a state layer; the file's layer ids are
//! therefore positions in that list, not the model's ids. The file is the
//! geometry written by the geometry serialiser (`to_toml`), named by its
//! path.

use super::error::DeriveError;
use super::families::MambaArch;
use super::sglang_engine::{derive_sglang_engine, SglangEngine};
use super::sglang_model::{SglangAttention, SglangLinear, SglangModel};
use crate::geometry::sglang_state::{SglangState, StateKind};
use crate::geometry::{
    parse_geometry, to_toml_named_by_path, AttentionSpec, EngineGeometry, ExpectedRejection,
    Geometry, GroupKind, ModelSpec, SglangSpec, Stack,
};

/// What shapes the file besides the model.
#[derive(Clone, Debug)]
pub struct SglangPairOptions {
    /// The prefill engine's TP (its attention TP).
    pub prefill_tp: u64,
    /// The decode engine's TP.
    pub decode_tp: u64,
    /// Tokens per page, the same on both engines.
    pub page_size: u64,
    /// Keep the first this many attention layers and the first this many
    /// state layers, in the model's order; `None` keeps all.
    pub layers: Option<u64>,
    /// The file's prompt lengths; `None`: one, two pages and their
    /// neighbours.
    pub prompts: Option<Vec<u32>>,
    /// `expect_rejection`, for a pair SGLang must refuse.
    pub expect_rejection: Option<String>,
    /// Where the config came from, for the description.
    pub source: String,
}

/// The pair: both engines and the file that states them.
#[derive(Clone, Debug)]
pub struct SglangPair {
    /// The prefill engine.
    pub prefill: SglangEngine,
    /// The decode engine.
    pub decode: SglangEngine,
    /// The geometry file's text.
    pub text: String,
    /// The file as kvgeom reads it.
    pub geometry: Geometry,
}

/// The file's layers in order: `true` for attention, `false` for state.
fn file_layers(model: &SglangModel) -> Vec<bool> {
    let last = model
        .attention_layers
        .iter()
        .chain(&model.linear_layers)
        .max()
        .map_or(0, |m| m + 1);
    let mut kinds = Vec::new();
    for id in 0..last {
        if model.attention_layers.contains(&id) {
            kinds.push(true);
        }
        if model.linear_layers.contains(&id) {
            kinds.push(false);
        }
    }
    kinds
}

/// Page boundaries: one and two pages, each with its neighbours.
fn boundary_prompts(page: u64) -> Result<Vec<u32>, DeriveError> {
    let mut lengths = vec![1, 2];
    for b in [page, 2 * page] {
        lengths.extend([b.saturating_sub(1), b, b + 1]);
    }
    lengths.retain(|l| *l >= 1);
    lengths.sort_unstable();
    lengths.dedup();
    lengths
        .into_iter()
        .map(|l| {
            u32::try_from(l).map_err(|_| {
                unsupported(format!(
                    "--page-size {page}: a prompt of {l} tokens is too long"
                ))
            })
        })
        .collect()
}

/// `[model.state]` of the file: the mixer's fields, the state layers at
/// their positions among the file's layers (`kinds`: `false` for state).
fn state_of(
    linear: &SglangLinear,
    kinds: &[bool],
    n: &dyn Fn(u64, &str) -> Result<u32, DeriveError>,
) -> Result<SglangState, DeriveError> {
    if linear.temporal_dtype != "float32" {
        return Err(unsupported(format!(
            "the config's mamba_ssm_dtype {}: SGLang geometry files state float32 temporal state only",
            linear.temporal_dtype
        )));
    }
    let layers = kinds
        .iter()
        .enumerate()
        .filter(|(_, attention)| !**attention)
        .map(|(i, _)| n(i as u64, "a layer id"))
        .collect::<Result<Vec<u32>, _>>()?;
    let mut state = SglangState {
        kind: StateKind::Mamba2,
        layers,
        conv_kernel: n(linear.mixer.conv_kernel(), "conv_kernel")?,
        n_groups: None,
        ssm_state_size: None,
        num_heads: None,
        head_dim: None,
        num_k_heads: None,
        head_k_dim: None,
        num_v_heads: None,
        head_v_dim: None,
    };
    // SGLang's files state x's channels as heads x head_dim.
    if let MambaArch::Mamba2 {
        intermediate_size: channels,
        num_heads: heads,
        head_dim: dim,
        ..
    } = linear.mixer
    {
        if channels != heads * dim {
            return Err(unsupported(format!(
                "the Mamba2 channels {channels} are not heads x head_dim ({heads} x {dim}); SGLang geometry files state that case only"
            )));
        }
    }
    match linear.mixer {
        MambaArch::Mamba2 {
            n_groups,
            state_size,
            num_heads,
            head_dim,
            ..
        } => {
            state.n_groups = Some(n(n_groups, "n_groups")?);
            state.ssm_state_size = Some(n(state_size, "ssm_state_size")?);
            state.num_heads = Some(n(num_heads, "num_heads")?);
            state.head_dim = Some(n(head_dim, "head_dim")?);
        }
        MambaArch::Gdn {
            head_v_dim,
            num_v_heads,
            head_k_dim,
            num_k_heads,
            ..
        } => {
            state.kind = StateKind::Gdn;
            state.num_k_heads = Some(n(num_k_heads, "num_k_heads")?);
            state.head_k_dim = Some(n(head_k_dim, "head_k_dim")?);
            state.num_v_heads = Some(n(num_v_heads, "num_v_heads")?);
            state.head_v_dim = Some(n(head_v_dim, "head_v_dim")?);
        }
        MambaArch::Kda {
            num_heads,
            head_dim,
            ..
        } => {
            state.kind = StateKind::Kda;
            state.num_heads = Some(n(num_heads, "num_heads")?);
            state.head_dim = Some(n(head_dim, "head_dim")?);
        }
        MambaArch::Mamba1 { .. } => {
            return Err(unsupported(
                "a Mamba1 state: SGLang geometry files state Mamba2, GDN and KDA".into(),
            ))
        }
    }
    Ok(state)
}

fn unsupported(what: String) -> DeriveError {
    DeriveError::Unsupported(what)
}

/// Derive both engines and write the file; what is written must load.
pub fn derive_sglang_pair(
    model: &SglangModel,
    options: &SglangPairOptions,
) -> Result<SglangPair, DeriveError> {
    let prefill = derive_sglang_engine(model, options.prefill_tp)?;
    let decode = derive_sglang_engine(model, options.decode_tp)?;
    if options.page_size == 0 {
        return Err(DeriveError::ZeroOption {
            option: "--page-size",
        });
    }
    let mut kinds = file_layers(model);
    if let Some(n) = options.layers {
        if n == 0 {
            return Err(DeriveError::ZeroOption { option: "--layers" });
        }
        let (mut attention, mut state) = (0, 0);
        kinds.retain(|a| {
            let seen = if *a { &mut attention } else { &mut state };
            *seen += 1;
            *seen <= n
        });
    }
    let n = |value: u64, what: &str| {
        u32::try_from(value)
            .map_err(|_| unsupported(format!("{what} {value} is more than a geometry file holds")))
    };
    let attention = match model.attention {
        SglangAttention::Full {
            total_kv_heads,
            head_dim,
            ..
        } => AttentionSpec::Full {
            total_kv_heads: n(total_kv_heads, "total_kv_heads")?,
            head_size: n(head_dim, "head_dim")?,
            dtype_bytes: n(model.dtype_bytes, "dtype_bytes")?,
        },
        SglangAttention::Mla {
            kv_lora_rank,
            qk_rope_head_dim,
        } => AttentionSpec::Mla {
            head_size: n(
                kv_lora_rank + qk_rope_head_dim,
                "kv_lora_rank + qk_rope_head_dim",
            )?,
            dtype_bytes: n(model.dtype_bytes, "dtype_bytes")?,
        },
    };
    let v_head_size = match model.attention {
        SglangAttention::Full {
            head_dim,
            v_head_dim,
            ..
        } if v_head_dim != head_dim => Some(n(v_head_dim, "v_head_dim")?),
        _ => None,
    };
    let state = match &model.linear {
        None => None,
        Some(linear) => Some(state_of(linear, &kinds, &n)?),
    };
    let engine = |tp: u64| -> Result<EngineGeometry, DeriveError> {
        let page = n(options.page_size, "--page-size")?;
        // The page is both blocks; token-major, no pool size, no padding.
        Ok(EngineGeometry::new(n(tp, "the TP size")?, page, page))
    };
    let prompts = match &options.prompts {
        Some(lengths) => lengths.clone(),
        None => boundary_prompts(options.page_size)?,
    };
    let written = Geometry {
        name: String::new(),
        description: format!(
            "{} from {}: prefill attention TP{} -> decode TP{}, pages of {}",
            model.family.models(),
            options.source.replace('\\', "/"),
            options.prefill_tp,
            options.decode_tp,
            options.page_size
        ),
        model: ModelSpec {
            attention: Some(attention),
            mamba: None,
            groups: vec![GroupKind::Attention],
            layer_slots: n(kinds.len() as u64, "the layer count")?,
            state_slots: None,
        },
        prefill: engine(options.prefill_tp)?,
        decode: engine(options.decode_tp)?,
        prompts: Some(prompts),
        expect_rejection: options
            .expect_rejection
            .clone()
            .map(ExpectedRejection::both),
        stack: Stack::Sglang,
        handshake: crate::geometry::HandshakeCompat::default(),
        sglang: Some(SglangSpec {
            v_head_size,
            prefill_tp_size: n(options.prefill_tp, "--prefill-tp")?,
            decode_tp_size: n(options.decode_tp, "--decode-tp")?,
            state,
        }),
    };
    let mut out = format!(
        "# Derived by `kvgeom derive --stack sglang` from {} ({}), as SGLang 0.5.23 builds its pools.\n",
        options.source,
        model.family.models()
    );
    out.push_str(&format!(
        "# The file's layers are the model's attention and state layers in order (MLP-only layers left out{}).\n",
        if model
            .attention_layers
            .iter()
            .any(|a| model.linear_layers.contains(a))
        {
            "; each layer with both is an attention layer then a state layer"
        } else {
            ""
        }
    ));
    if let SglangAttention::Mla {
        kv_lora_rank,
        qk_rope_head_dim,
    } = model.attention
    {
        out.push_str(&format!(
            "# MLA head_size: kv_lora_rank {kv_lora_rank} + qk_rope_head_dim {qk_rope_head_dim}.\n"
        ));
    }
    out.push_str(&to_toml_named_by_path(&written));
    let geometry = parse_geometry("derived.toml", &out)
        .map_err(|e| unsupported(format!("the derived SGLang geometry does not load: {e}")))?;
    Ok(SglangPair {
        prefill,
        decode,
        text: out,
        geometry,
    })
}
