//! What a model's HF config says under SGLang 0.5.23's rules (`kvgeom derive
//! --stack sglang`): which layers hold attention KV and which a linear
//! state, the attention heads, and the state's dimensions. SGLang's config
//! classes read the same fields as vLLM's; what differs is that SGLang keeps
//! layer ids (its pools are indexed by them) and runs fewer families.

use super::error::DeriveError;
use super::families::Family;
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

/// The linear-attention mixer whose per-request state SGLang's `MambaPool`
/// keeps, with its dimensions over all ranks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SglangMixer {
    /// Mamba2 (Nemotron-H, Falcon-H1, Granite-4.0-H): conv rows `x | B | C`,
    /// groups replicated when the attention TP does not divide them.
    Mamba2 {
        /// `x`'s channels.
        intermediate_size: u64,
        /// B/C groups before replication.
        n_groups: u64,
        /// SSM heads.
        num_heads: u64,
        /// Channels per SSM head.
        head_dim: u64,
        /// SSM state per head channel.
        state_size: u64,
    },
    /// Gated DeltaNet (Qwen3-Next): conv rows `q | k | v`, each sharded on
    /// its own.
    Gdn {
        /// Key (and query) heads.
        num_k_heads: u64,
        /// Channels per key head.
        head_k_dim: u64,
        /// Value heads.
        num_v_heads: u64,
        /// Channels per value head.
        head_v_dim: u64,
    },
    /// Kimi Delta Attention (Kimi-Linear): conv `[K-1, q | k | v]`.
    Kda {
        /// Heads.
        num_heads: u64,
        /// Channels per head.
        head_dim: u64,
    },
}

/// The linear layers' state over all ranks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SglangLinear {
    /// The mixer and its dimensions.
    pub mixer: SglangMixer,
    /// The causal conv's kernel width `K` (the conv state keeps `K - 1` steps).
    pub conv_kernel: u64,
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

const WHY_STATE: &str = "the linear-attention state";

impl SglangModel {
    /// Read a config of a family SGLang runs.
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
        let dtype_bytes = match config.opt_str("torch_dtype")?.or(config.opt_str("dtype")?) {
            Some("float16") | Some("bfloat16") | Some("float32") | None => 2,
            Some(_) => {
                return Err(config.bad(
                    "torch_dtype",
                    "bfloat16, float16 or float32",
                    config
                        .value("torch_dtype")
                        .unwrap_or(&serde_json::Value::Null),
                ))
            }
        };
        let layers = |c: &HfConfig| c.positive("num_hidden_layers", "the layer count");
        let model = match family {
            Family::Llama => SglangModel {
                family,
                dtype_bytes,
                attention: full(config, None)?,
                attention_layers: (0..layers(config)?).collect(),
                linear_layers: vec![],
                linear: None,
            },
            Family::DeepseekV3 => SglangModel {
                family,
                dtype_bytes,
                attention: mla(config)?,
                attention_layers: (0..layers(config)?).collect(),
                linear_layers: vec![],
                linear: None,
            },
            Family::Qwen3Next => qwen3_next(config, dtype_bytes)?,
            Family::NemotronH => nemotron_h(config, dtype_bytes)?,
            Family::KimiLinear => kimi_linear(config, dtype_bytes)?,
            Family::FalconH1 => falcon_h1(config, dtype_bytes)?,
            Family::GraniteMoeHybrid => granite(config, dtype_bytes)?,
            Family::Jamba | Family::Zamba2 => unreachable!("refused above"),
        };
        Ok(model)
    }
}

fn full(config: &HfConfig, head_dim: Option<u64>) -> Result<SglangAttention, DeriveError> {
    let heads = config.positive("num_attention_heads", "the attention head count")?;
    let head_dim = match head_dim.or(config.opt_positive("head_dim")?) {
        Some(h) => h,
        None => config.positive("hidden_size", "the head size")? / heads,
    };
    Ok(SglangAttention::Full {
        total_kv_heads: config.opt_positive("num_key_value_heads")?.unwrap_or(heads),
        head_dim,
        v_head_dim: config.opt_positive("v_head_dim")?.unwrap_or(head_dim),
    })
}

fn mla(config: &HfConfig) -> Result<SglangAttention, DeriveError> {
    Ok(SglangAttention::Mla {
        kv_lora_rank: config.positive("kv_lora_rank", "the MLA latent width")?,
        qk_rope_head_dim: config.positive("qk_rope_head_dim", "the MLA latent width")?,
    })
}

fn kernel(config: &HfConfig, field: &str) -> Result<u64, DeriveError> {
    let k = config.positive(field, "the conv state steps (kernel - 1)")?;
    if k < 2 {
        return Err(config.bad(field, "at least 2", &serde_json::json!(k)));
    }
    Ok(k)
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

fn qwen3_next(config: &HfConfig, dtype_bytes: u64) -> Result<SglangModel, DeriveError> {
    let layers = config.positive("num_hidden_layers", "the layer count")?;
    let kinds: Vec<Option<bool>> = match config.opt_str_list("layer_types")? {
        Some(types) => types.iter().map(|t| Some(t == "full_attention")).collect(),
        None => {
            let interval = config.opt_positive("full_attention_interval")?.unwrap_or(4);
            (0..layers).map(|i| Some((i + 1) % interval == 0)).collect()
        }
    };
    let (attention_layers, linear_layers) = split_ids(&kinds);
    Ok(SglangModel {
        family: Family::Qwen3Next,
        dtype_bytes,
        attention: full(config, None)?,
        attention_layers,
        linear_layers,
        linear: Some(SglangLinear {
            mixer: SglangMixer::Gdn {
                num_k_heads: config.positive("linear_num_key_heads", WHY_STATE)?,
                head_k_dim: config.positive("linear_key_head_dim", WHY_STATE)?,
                num_v_heads: config.positive("linear_num_value_heads", WHY_STATE)?,
                head_v_dim: config.positive("linear_value_head_dim", WHY_STATE)?,
            },
            conv_kernel: kernel(config, "linear_conv_kernel_dim")?,
            temporal_dtype: temporal_dtype(config)?,
        }),
    })
}

fn nemotron_h(config: &HfConfig, dtype_bytes: u64) -> Result<SglangModel, DeriveError> {
    let kinds: Vec<Option<bool>> = match config.opt_str("hybrid_override_pattern")? {
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
    };
    let (attention_layers, linear_layers) = split_ids(&kinds);
    let heads = config.positive("mamba_num_heads", WHY_STATE)?;
    let head_dim = config.positive("mamba_head_dim", WHY_STATE)?;
    let attention_head_dim = match config.opt_positive("head_dim")? {
        Some(h) => Some(h),
        None => config.opt_positive("attention_head_dim")?,
    };
    Ok(SglangModel {
        family: Family::NemotronH,
        dtype_bytes,
        attention: full(config, attention_head_dim)?,
        attention_layers,
        linear_layers,
        linear: Some(SglangLinear {
            mixer: SglangMixer::Mamba2 {
                intermediate_size: heads * head_dim,
                n_groups: config.positive("n_groups", WHY_STATE)?,
                num_heads: heads,
                head_dim,
                state_size: config.positive("ssm_state_size", WHY_STATE)?,
            },
            conv_kernel: kernel(config, "conv_kernel")?,
            temporal_dtype: temporal_dtype(config)?,
        }),
    })
}

/// Kimi-Linear's `kda_layers` count layers from 1: layer id `i` is KDA
/// when `i + 1` is listed, and every other layer is MLA.
fn kimi_linear(config: &HfConfig, dtype_bytes: u64) -> Result<SglangModel, DeriveError> {
    let layers = config.positive("num_hidden_layers", "the layer count")?;
    let linear = config.sub_config("linear_attn_config", WHY_STATE)?;
    let kda = linear.opt_index_list("kda_layers")?.unwrap_or_default();
    let kinds: Vec<Option<bool>> = (0..layers).map(|i| Some(!kda.contains(&(i + 1)))).collect();
    let (attention_layers, linear_layers) = split_ids(&kinds);
    Ok(SglangModel {
        family: Family::KimiLinear,
        dtype_bytes,
        attention: mla(config)?,
        attention_layers,
        linear_layers,
        linear: Some(SglangLinear {
            mixer: SglangMixer::Kda {
                num_heads: linear.positive("num_heads", WHY_STATE)?,
                head_dim: linear.positive("head_dim", WHY_STATE)?,
            },
            conv_kernel: kernel(&linear, "short_conv_kernel_size")?,
            temporal_dtype: "float32",
        }),
    })
}

/// Falcon-H1: attention and Mamba2 in every layer.
fn falcon_h1(config: &HfConfig, dtype_bytes: u64) -> Result<SglangModel, DeriveError> {
    let layers = config.positive("num_hidden_layers", "the layer count")?;
    let intermediate = match config.opt_positive("mamba_d_ssm")? {
        Some(d) => d,
        None => {
            let expand = config.opt_number("mamba_expand")?.unwrap_or(2.0);
            (expand * config.positive("hidden_size", "the Mamba2 channels")? as f64) as u64
        }
    };
    Ok(SglangModel {
        family: Family::FalconH1,
        dtype_bytes,
        attention: full(config, None)?,
        attention_layers: (0..layers).collect(),
        linear_layers: (0..layers).collect(),
        linear: Some(SglangLinear {
            mixer: SglangMixer::Mamba2 {
                intermediate_size: intermediate,
                n_groups: config.positive("mamba_n_groups", WHY_STATE)?,
                num_heads: config.positive("mamba_n_heads", WHY_STATE)?,
                head_dim: config.positive("mamba_d_head", WHY_STATE)?,
                state_size: config.positive("mamba_d_state", WHY_STATE)?,
            },
            conv_kernel: kernel(config, "mamba_d_conv")?,
            temporal_dtype: temporal_dtype(config)?,
        }),
    })
}

/// Granite-4.0-H: the config class's defaults apply to fields the file
/// leaves out; SGLang keeps the default state dtypes for it.
fn granite(config: &HfConfig, dtype_bytes: u64) -> Result<SglangModel, DeriveError> {
    let hidden = config.positive("hidden_size", "the Mamba2 channels")?;
    let intermediate = config.opt_positive("mamba_expand")?.unwrap_or(2) * hidden;
    let heads = config.opt_positive("mamba_n_heads")?.unwrap_or(128);
    let head_dim = match config.value("mamba_d_head") {
        None => intermediate / heads,
        Some(serde_json::Value::String(s)) if s == "auto" => intermediate / heads,
        Some(_) => config.positive("mamba_d_head", WHY_STATE)?,
    };
    let layers = config.positive("num_hidden_layers", "the layer count")?;
    let types = config
        .opt_str_list("layer_types")?
        .unwrap_or_else(|| vec!["mamba".to_string(); layers as usize]);
    let kinds: Vec<Option<bool>> = types
        .iter()
        .map(|t| match t.as_str() {
            "attention" | "full_attention" => Some(true),
            "mamba" => Some(false),
            _ => None,
        })
        .collect();
    let (attention_layers, linear_layers) = split_ids(&kinds);
    Ok(SglangModel {
        family: Family::GraniteMoeHybrid,
        dtype_bytes,
        attention: full(config, None)?,
        attention_layers,
        linear_layers,
        linear: Some(SglangLinear {
            mixer: SglangMixer::Mamba2 {
                intermediate_size: intermediate,
                n_groups: config.opt_positive("mamba_n_groups")?.unwrap_or(1),
                num_heads: heads,
                head_dim,
                state_size: config.opt_positive("mamba_d_state")?.unwrap_or(256),
            },
            conv_kernel: config.opt_positive("mamba_d_conv")?.unwrap_or(4),
            temporal_dtype: "float32",
        }),
    })
}
