//! What a model's HF config says under SGLang 0.5.23's rules (`kvgeom derive
//! --stack sglang`): which layers hold attention KV and which a linear
//! state, the attention heads, and the state's dimensions. SGLang's config
//! classes read the same fields as vLLM's, so the shapes come from the one
//! reader of both stacks (`families::ModelArch::from_config`); what differs
//! is read here: SGLang keeps layer ids (its pools are indexed by them), V's
//! head size and the temporal state's dtype, and runs fewer families.

use super::error::DeriveError;
use super::families::{AttentionArch, Family, MambaArch, ModelArch};
use super::hf_config::HfConfig;

/// The families SGLang 0.5.23 has a model for.
const SGLANG_FAMILIES: [Family; 7] = [
    Family::Qwen3Next,
    Family::NemotronH,
    Family::KimiLinear,
    Family::FalconH1,
    Family::GraniteMoeHybrid,
    Family::DeepseekV3,
    Family::Llama,
];

/// The attention KV cache over all ranks, as SGLang's token pools hold it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SglangAttention {
    /// MHA/GQA: one K and one V buffer per layer, heads sharded over the
    /// attention TP (at least one per rank).
    Full {
        /// KV heads over all ranks (`num_key_value_heads`, else the query heads).
        total_kv_heads: u64,
        /// K's elements per head (`head_dim`, else `hidden_size / heads`).
        head_dim: u64,
        /// V's elements per head (`v_head_dim`, else K's).
        v_head_dim: u64,
    },
    /// MLA: one latent buffer per layer of `kv_lora_rank + qk_rope_head_dim`,
    /// the same on every rank.
    Mla {
        /// The compressed latent's width.
        kv_lora_rank: u64,
        /// The rotary key part's width.
        qk_rope_head_dim: u64,
    },
}

/// The linear layers' state over all ranks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SglangLinear {
    /// The mixer and its dimensions, as both stacks read them (never
    /// Mamba1: SGLang runs no Mamba1 family).
    pub mixer: MambaArch,
    /// The temporal state's dtype name when the config sets
    /// `mamba_ssm_dtype` (families whose config SGLang reads it from).
    pub temporal_dtype: &'static str,
}

/// A model as SGLang 0.5.23 builds its KV and state pools.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SglangModel {
    /// The family.
    pub family: Family,
    /// Bytes per element of the KV cache (the model dtype).
    pub dtype_bytes: u64,
    /// The attention KV cache.
    pub attention: SglangAttention,
    /// The layer ids with an attention KV cache.
    pub attention_layers: Vec<u64>,
    /// The layer ids with a linear state (a layer may have both: Falcon-H1).
    pub linear_layers: Vec<u64>,
    /// The linear state; `None` for attention-only models.
    pub linear: Option<SglangLinear>,
}

/// `model_type (models)` of every family SGLang runs, for messages.
pub fn sglang_supported_list() -> Vec<&'static str> {
    Family::supported_list()
        .into_iter()
        .zip(Family::ALL)
        .filter(|(_, f)| SGLANG_FAMILIES.contains(f))
        .map(|(s, _)| s)
        .collect()
}

impl SglangModel {
    /// Read a config of a family SGLang runs: the shapes through the one
    /// reader of both stacks ([`ModelArch::from_config`]), then what only
    /// SGLang keeps (the layer ids, V's head size, the temporal dtype).
    pub fn from_config(config: &HfConfig) -> Result<SglangModel, DeriveError> {
        let family = Family::from_model_type(&config.model_type).ok_or_else(|| {
            DeriveError::UnknownModelType {
                source_name: config.source.clone(),
                model_type: config.model_type.clone(),
                supported: sglang_supported_list(),
            }
        })?;
        if !SGLANG_FAMILIES.contains(&family) {
            return Err(DeriveError::NotInSglang {
                source_name: config.source.clone(),
                model_type: config.model_type.clone(),
                models: family.models(),
                supported: sglang_supported_list(),
            });
        }
        let arch = ModelArch::from_config(config)?;
        let attention = match arch.attention {
            AttentionArch::Full {
                total_kv_heads,
                head_size,
                ..
            } => SglangAttention::Full {
                total_kv_heads,
                head_dim: head_size,
                v_head_dim: config.opt_positive("v_head_dim")?.unwrap_or(head_size),
            },
            AttentionArch::Mla {
                kv_lora_rank,
                qk_rope_head_dim,
                ..
            } => SglangAttention::Mla {
                kv_lora_rank,
                qk_rope_head_dim,
            },
        };
        let (attention_layers, linear_layers) = layer_ids(config, family)?;
        let linear = match arch.mamba {
            None => None,
            Some(mamba) => Some(linear_state(config, family, mamba)?),
        };
        Ok(SglangModel {
            family,
            dtype_bytes: arch.dtype.bytes(),
            attention,
            attention_layers,
            linear_layers,
            linear,
        })
    }
}

/// The state as SGLang's `MambaPool` takes it: the mixer and its temporal
/// dtype, `mamba_ssm_dtype` for the families whose config SGLang reads it
/// from (float32 when unset), float32 for the others.
fn linear_state(
    config: &HfConfig,
    family: Family,
    mixer: MambaArch,
) -> Result<SglangLinear, DeriveError> {
    let temporal_dtype = match family {
        Family::KimiLinear | Family::GraniteMoeHybrid => "float32",
        _ => temporal_dtype(config)?,
    };
    Ok(SglangLinear {
        mixer,
        temporal_dtype,
    })
}

/// SGLang reads `mamba_ssm_dtype` for Mamba2 and GDN configs (float32 when unset).
fn temporal_dtype(config: &HfConfig) -> Result<&'static str, DeriveError> {
    match config.opt_str("mamba_ssm_dtype")? {
        None | Some("float32") => Ok("float32"),
        Some("bfloat16") => Ok("bfloat16"),
        Some("float16") => Ok("float16"),
        Some(_) => Err(config.bad(
            "mamba_ssm_dtype",
            "float32, bfloat16 or float16",
            config
                .value("mamba_ssm_dtype")
                .unwrap_or(&serde_json::Value::Null),
        )),
    }
}

/// Split `0..n` by a per-layer kind: (attention ids, linear ids).
fn split_ids(kinds: &[Option<bool>]) -> (Vec<u64>, Vec<u64>) {
    let ids = |want: bool| {
        kinds
            .iter()
            .enumerate()
            .filter(|(_, k)| **k == Some(want))
            .map(|(i, _)| i as u64)
            .collect()
    };
    (ids(true), ids(false))
}

/// The layer ids of each kind (SGLang's pools are indexed by them):
/// (attention ids, linear ids); a layer may be in both (Falcon-H1).
fn layer_ids(config: &HfConfig, family: Family) -> Result<(Vec<u64>, Vec<u64>), DeriveError> {
    let layers = || config.positive("num_hidden_layers", "the layer count");
    let kinds: Vec<Option<bool>> = match family {
        Family::Llama | Family::DeepseekV3 => return Ok(((0..layers()?).collect(), vec![])),
        Family::FalconH1 => {
            let all: Vec<u64> = (0..layers()?).collect();
            return Ok((all.clone(), all));
        }
        Family::Qwen3Next => match config.opt_str_list("layer_types")? {
            Some(types) => types.iter().map(|t| Some(t == "full_attention")).collect(),
            None => {
                let interval = config.opt_positive("full_attention_interval")?.unwrap_or(4);
                (0..layers()?)
                    .map(|i| Some((i + 1) % interval == 0))
                    .collect()
            }
        },
        Family::NemotronH => match config.opt_str("hybrid_override_pattern")? {
            Some(pattern) => pattern
                .chars()
                .map(|c| match c {
                    '*' => Some(true),
                    'M' => Some(false),
                    _ => None,
                })
                .collect(),
            None => {
                return Err(DeriveError::MissingField {
                    source_name: config.source.clone(),
                    model_type: config.model_type.clone(),
                    field: "hybrid_override_pattern".into(),
                    why: "which layers are mamba and which attention",
                })
            }
        },
        // Kimi-Linear's `kda_layers` count layers from 1: layer id `i` is
        // KDA when `i + 1` is listed, and every other layer is MLA.
        Family::KimiLinear => {
            let kda = config
                .sub_config("linear_attn_config", "the KDA layers and state")?
                .opt_index_list("kda_layers")?
                .unwrap_or_default();
            (0..layers()?)
                .map(|i| Some(!kda.contains(&(i + 1))))
                .collect()
        }
        // Granite-4.0-H: every layer is mamba when `layer_types` is unset.
        Family::GraniteMoeHybrid => config
            .opt_str_list("layer_types")?
            .unwrap_or_else(|| vec!["mamba".to_string(); layers().unwrap_or(0) as usize])
            .iter()
            .map(|t| match t.as_str() {
                "attention" | "full_attention" => Some(true),
                "mamba" => Some(false),
                _ => None,
            })
            .collect(),
        Family::Jamba | Family::Zamba2 => {
            return Err(DeriveError::NotInSglang {
                source_name: config.source.clone(),
                model_type: config.model_type.clone(),
                models: family.models(),
                supported: sglang_supported_list(),
            })
        }
    };
    Ok(split_ids(&kinds))
}
