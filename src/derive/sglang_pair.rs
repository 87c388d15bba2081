//! A P/D pair under SGLang 0.5.23 as an SGLang geometry file (`stack =
//! "sglang"`, docs/geometry-format.md), which `kvgeom sweep --connector
//! sglang` runs.
//!
//! The format gives each layer one kind: the layers `[model.state]` lists
//! keep a linear state, the others attention KV. Layers with neither (MLP
//! only) are left out, and a layer with both (Falcon-H1) becomes an
//! attention layer followed by a state layer; the file's layer ids are
//! therefore positions in that list, not the model's ids.

use std::fmt::Write as _;

use super::error::DeriveError;
use super::sglang_engine::{derive_sglang_engine, SglangEngine};
use super::sglang_model::{SglangAttention, SglangMixer, SglangModel};
use crate::geometry::{parse_geometry, Geometry};

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
    /// The file's `prompts` entries; `None`: one, two pages and their
    /// neighbours.
    pub prompts: Option<Vec<String>>,
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
fn boundary_prompts(page: u64) -> Vec<String> {
    let mut lengths = vec![1, 2];
    for b in [page, 2 * page] {
        lengths.extend([b.saturating_sub(1), b, b + 1]);
    }
    lengths.retain(|l| *l >= 1);
    lengths.sort_unstable();
    lengths.dedup();
    lengths.iter().map(ToString::to_string).collect()
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
    let mut out = String::new();
    let w = &mut out;
    let _ = writeln!(
        w,
        "# Derived by `kvgeom derive --stack sglang` from {} ({}), as SGLang 0.5.23 builds its pools.",
        options.source,
        model.family.models()
    );
    let _ = writeln!(
        w,
        "# The file's layers are the model's attention and state layers in order (MLP-only layers left out{}).",
        if model
            .attention_layers
            .iter()
            .any(|a| model.linear_layers.contains(a))
        {
            "; each layer with both is an attention layer then a state layer"
        } else {
            ""
        }
    );
    let _ = writeln!(w, "stack = \"sglang\"");
    let _ = writeln!(
        w,
        "description = \"{} from {}: prefill attention TP{} -> decode TP{}, pages of {}\"",
        model.family.models(),
        options.source.replace('\\', "/").replace('"', "'"),
        options.prefill_tp,
        options.decode_tp,
        options.page_size
    );
    let prompts = options
        .prompts
        .clone()
        .unwrap_or_else(|| boundary_prompts(options.page_size));
    let _ = writeln!(w, "prompts = [{}]", prompts.join(", "));
    if let Some(text) = &options.expect_rejection {
        let _ = writeln!(w, "expect_rejection = {}", toml_string(text));
    }
    let _ = writeln!(w, "\n[model]\nlayers = {}\n", kinds.len());
    let _ = writeln!(w, "[model.attention]");
    match model.attention {
        SglangAttention::Full {
            total_kv_heads,
            head_dim,
            v_head_dim,
        } => {
            let _ = writeln!(w, "kind = \"full\"\ntotal_kv_heads = {total_kv_heads}");
            let _ = writeln!(w, "head_size = {head_dim}");
            if v_head_dim != head_dim {
                let _ = writeln!(w, "v_head_size = {v_head_dim}");
            }
        }
        SglangAttention::Mla {
            kv_lora_rank,
            qk_rope_head_dim,
        } => {
            let _ = writeln!(
                w,
                "kind = \"mla\"\nhead_size = {}   # kv_lora_rank {kv_lora_rank} + qk_rope_head_dim {qk_rope_head_dim}",
                kv_lora_rank + qk_rope_head_dim
            );
        }
    }
    let _ = writeln!(w, "dtype_bytes = {}", model.dtype_bytes);
    if let Some(linear) = &model.linear {
        if linear.temporal_dtype != "float32" {
            return Err(unsupported(format!(
                "the config's mamba_ssm_dtype {}: SGLang geometry files state float32 temporal state only",
                linear.temporal_dtype
            )));
        }
        let ids: Vec<String> = kinds
            .iter()
            .enumerate()
            .filter(|(_, a)| !**a)
            .map(|(i, _)| i.to_string())
            .collect();
        let _ = writeln!(w, "\n[model.state]");
        let _ = writeln!(
            w,
            "kind = \"{}\"",
            prefill.state.as_ref().map_or("", |s| s.kind)
        );
        let _ = writeln!(w, "layers = [{}]", ids.join(", "));
        let _ = writeln!(w, "conv_kernel = {}", linear.conv_kernel);
        match linear.mixer {
            SglangMixer::Mamba2 {
                intermediate_size,
                n_groups,
                num_heads,
                head_dim,
                state_size,
            } => {
                if intermediate_size != num_heads * head_dim {
                    return Err(unsupported(format!(
                        "the Mamba2 channels {intermediate_size} are not heads x head_dim ({num_heads} x {head_dim}); SGLang geometry files state that case only"
                    )));
                }
                let _ = writeln!(
                    w,
                    "n_groups = {n_groups}\nssm_state_size = {state_size}\nnum_heads = {num_heads}\nhead_dim = {head_dim}"
                );
            }
            SglangMixer::Gdn {
                num_k_heads,
                head_k_dim,
                num_v_heads,
                head_v_dim,
            } => {
                let _ = writeln!(
                    w,
                    "num_k_heads = {num_k_heads}\nhead_k_dim = {head_k_dim}\nnum_v_heads = {num_v_heads}\nhead_v_dim = {head_v_dim}"
                );
            }
            SglangMixer::Kda {
                num_heads,
                head_dim,
            } => {
                let _ = writeln!(w, "num_heads = {num_heads}\nhead_dim = {head_dim}");
            }
        }
    }
    for (engine, tp) in [
        ("prefill", options.prefill_tp),
        ("decode", options.decode_tp),
    ] {
        let _ = writeln!(
            w,
            "\n[{engine}]\ntp_size = {tp}\npage_size = {}",
            options.page_size
        );
    }
    let geometry = parse_geometry("derived.toml", &out)
        .map_err(|e| unsupported(format!("the derived SGLang geometry does not load: {e}")))?;
    Ok(SglangPair {
        prefill,
        decode,
        text: out,
        geometry,
    })
}

/// A TOML basic string.
fn toml_string(text: &str) -> String {
    toml::Value::String(text.to_string()).to_string()
}
