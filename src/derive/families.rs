//! The model families kvgeom derives geometry for, and what each one's HF
//! config says about its attention and mamba layers (field names and
//! defaults as in the `transformers` config classes that vLLM 0.33.0 loads).

use super::dtype::Dtype;
use super::error::DeriveError;
use super::hf_config::HfConfig;

/// A supported model family, keyed by the config's `model_type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// `qwen3_next`: Qwen3-Next, Gated DeltaNet (GDN) layers with full
    /// attention every few layers.
    Qwen3Next,
    /// `nemotron_h`: Nemotron-H and Nemotron-Nano-v2, Mamba2 and attention
    /// layers.
    NemotronH,
    /// `kimi_linear`: Kimi-Linear, Kimi Delta Attention (KDA) layers with
    /// MLA layers.
    KimiLinear,
    /// `falcon_h1`: Falcon-H1, attention and Mamba2 side by side in every
    /// layer.
    FalconH1,
    /// `granitemoehybrid`: Granite-4.0-H, Mamba2 and attention layers.
    GraniteMoeHybrid,
    /// `jamba`: Jamba, Mamba1 layers with an attention layer every
    /// `attn_layer_period` layers.
    Jamba,
    /// `zamba2`: Zamba2, Mamba2 in every layer and a shared attention block
    /// in its hybrid layers.
    Zamba2,
    /// `deepseek_v3`: DeepSeek-V3, MLA only (no mamba state).
    DeepseekV3,
    /// `llama`: Llama, dense GQA only (no mamba state).
    Llama,
}

impl Family {
    /// Every supported family.
    pub const ALL: [Family; 9] = [
        Family::Qwen3Next,
        Family::NemotronH,
        Family::KimiLinear,
        Family::FalconH1,
        Family::GraniteMoeHybrid,
        Family::Jamba,
        Family::Zamba2,
        Family::DeepseekV3,
        Family::Llama,
    ];

    /// The HF `model_type`.
    pub fn model_type(self) -> &'static str {
        match self {
            Family::Qwen3Next => "qwen3_next",
            Family::NemotronH => "nemotron_h",
            Family::KimiLinear => "kimi_linear",
            Family::FalconH1 => "falcon_h1",
            Family::GraniteMoeHybrid => "granitemoehybrid",
            Family::Jamba => "jamba",
            Family::Zamba2 => "zamba2",
            Family::DeepseekV3 => "deepseek_v3",
            Family::Llama => "llama",
        }
    }

    /// Models of the family, for messages.
    pub fn models(self) -> &'static str {
        match self {
            Family::Qwen3Next => "Qwen3-Next (GDN)",
            Family::NemotronH => "Nemotron-H, Nemotron-Nano-v2 (Mamba2)",
            Family::KimiLinear => "Kimi-Linear (KDA + MLA)",
            Family::FalconH1 => "Falcon-H1 (attention and Mamba2 in every layer)",
            Family::GraniteMoeHybrid => "Granite-4.0-H (Mamba2)",
            Family::Jamba => "Jamba (Mamba1)",
            Family::Zamba2 => "Zamba2 (Mamba2 with shared attention)",
            Family::DeepseekV3 => "DeepSeek-V3 (MLA)",
            Family::Llama => "Llama (dense GQA)",
        }
    }

    /// The family whose HF `model_type` this is; `None` for an unsupported one.
    pub fn from_model_type(model_type: &str) -> Option<Family> {
        Family::ALL
            .into_iter()
            .find(|f| f.model_type() == model_type)
    }

    /// `model_type (models)` for every family, for the unknown-model message.
    pub fn supported_list() -> Vec<&'static str> {
        vec![
            "qwen3_next (Qwen3-Next)",
            "nemotron_h (Nemotron-H, Nemotron-Nano-v2)",
            "kimi_linear (Kimi-Linear)",
            "falcon_h1 (Falcon-H1)",
            "granitemoehybrid (Granite-4.0-H)",
            "jamba (Jamba)",
            "zamba2 (Zamba2)",
            "deepseek_v3 (DeepSeek-V3)",
            "llama (Llama)",
        ]
    }
}

/// The attention layers' shape over all ranks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AttentionArch {
    /// GQA/MHA: K and V per KV head, heads sharded over TP.
    Full {
        /// Query heads over all ranks (`num_attention_heads`).
        num_attention_heads: u64,
        /// KV heads over all ranks (`num_key_value_heads`, default: the
        /// query heads).
        total_kv_heads: u64,
        /// Elements per head (`head_dim`, else `hidden_size /
        /// num_attention_heads`, unless the family fixes it).
        head_size: u64,
    },
    /// Multi-head latent attention: one latent of `kv_lora_rank +
    /// qk_rope_head_dim` per token, the same on every rank.
    Mla {
        /// Query heads over all ranks (`num_attention_heads`).
        num_attention_heads: u64,
        /// Width of the compressed KV latent, in elements (`kv_lora_rank`).
        kv_lora_rank: u64,
        /// Width of the rotary key part stored beside it, in elements
        /// (`qk_rope_head_dim`).
        qk_rope_head_dim: u64,
    },
}

impl AttentionArch {
    /// Whether this is multi-head latent attention.
    pub fn is_mla(&self) -> bool {
        matches!(self, AttentionArch::Mla { .. })
    }

    /// Query heads over all ranks; TP must divide them.
    pub fn num_attention_heads(&self) -> u64 {
        match self {
            AttentionArch::Full {
                num_attention_heads,
                ..
            }
            | AttentionArch::Mla {
                num_attention_heads,
                ..
            } => *num_attention_heads,
        }
    }

    /// vLLM's `get_head_size`: the latent width for MLA.
    pub fn head_size(&self) -> u64 {
        match self {
            AttentionArch::Full { head_size, .. } => *head_size,
            AttentionArch::Mla {
                kv_lora_rank,
                qk_rope_head_dim,
                ..
            } => kv_lora_rank + qk_rope_head_dim,
        }
    }
}

/// The mamba-style state's dimensions over all ranks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MambaArch {
    /// Mamba1 (Jamba): conv state `I/tp x (K - 1)`, SSM state `I/tp x
    /// state_size`.
    Mamba1 {
        /// `I`, the inner channels (`mamba_expand x hidden_size`).
        intermediate_size: u64,
        /// SSM state size per channel (`mamba_d_state`).
        state_size: u64,
        /// Conv kernel width `K` (`mamba_d_conv`); the conv state keeps `K - 1`
        /// rows.
        conv_kernel: u64,
    },
    /// Mamba2 (Nemotron-H, Falcon-H1, Granite-4.0-H, Zamba2): conv state
    /// `(I + 2 x groups x state_size)/tp x (K - 1)`, SSM state `heads/tp x
    /// head_dim x state_size`, groups replicated when TP does not divide them.
    Mamba2 {
        /// `I`, the inner channels (x of the conv's x | B | C).
        intermediate_size: u64,
        /// B/C groups over all ranks, before replication.
        n_groups: u64,
        /// SSM heads over all ranks.
        num_heads: u64,
        /// Channels per SSM head.
        head_dim: u64,
        /// SSM state size per head channel (`d_state`).
        state_size: u64,
        /// Conv kernel width `K`; the conv state keeps `K - 1` rows.
        conv_kernel: u64,
    },
    /// Gated DeltaNet (Qwen3-Next): conv state `(2 x k_heads x k_dim +
    /// v_heads x v_dim)/tp x (K - 1)`, recurrent state `v_heads/tp x v_dim x
    /// k_dim`.
    Gdn {
        /// Key (and query) heads over all ranks (`linear_num_key_heads`).
        num_k_heads: u64,
        /// Value heads over all ranks (`linear_num_value_heads`).
        num_v_heads: u64,
        /// Channels per key head (`linear_key_head_dim`).
        head_k_dim: u64,
        /// Channels per value head (`linear_value_head_dim`).
        head_v_dim: u64,
        /// Conv kernel width `K` (`linear_conv_kernel_dim`); the conv state
        /// keeps `K - 1` rows.
        conv_kernel: u64,
    },
    /// Kimi Delta Attention (Kimi-Linear), as of vLLM 0.33.0: one conv state
    /// `(3 x heads x head_dim)/tp x (K - 1)` (Q | K | V), recurrent state
    /// `heads/tp x head_dim x head_dim`.
    Kda {
        /// KDA heads over all ranks (`linear_attn_config.num_heads`).
        num_heads: u64,
        /// Channels per head (`linear_attn_config.head_dim`).
        head_dim: u64,
        /// Conv kernel width `K` (`short_conv_kernel_size`); the conv state
        /// keeps `K - 1` rows.
        conv_kernel: u64,
    },
}

impl MambaArch {
    /// The conv kernel width `K` (the conv state keeps `K - 1` rows).
    pub fn conv_kernel(&self) -> u64 {
        match *self {
            MambaArch::Mamba1 { conv_kernel, .. }
            | MambaArch::Mamba2 { conv_kernel, .. }
            | MambaArch::Gdn { conv_kernel, .. }
            | MambaArch::Kda { conv_kernel, .. } => conv_kernel,
        }
    }

    /// The kind's name in derive reports: `mamba1`, `mamba2`, `gdn` or `kda`.
    pub fn kind_name(&self) -> &'static str {
        match self {
            MambaArch::Mamba1 { .. } => "mamba1",
            MambaArch::Mamba2 { .. } => "mamba2",
            MambaArch::Gdn { .. } => "gdn",
            MambaArch::Kda { .. } => "kda",
        }
    }
}

/// What a model's config says about its KV cache.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelArch {
    /// The family, from `model_type`.
    pub family: Family,
    /// The model dtype vLLM runs with `--dtype auto`.
    pub dtype: Dtype,
    /// The attention layers' heads over all ranks.
    pub attention: AttentionArch,
    /// The mamba-style layers' dimensions over all ranks; `None` for a model
    /// with attention only.
    pub mamba: Option<MambaArch>,
    /// Layers with an attention KV cache.
    pub attention_layers: u64,
    /// Layers with mamba state.
    pub mamba_layers: u64,
    /// The first layer holding a KV cache is a mamba layer.
    pub mamba_first: bool,
    /// The SSM state dtype vLLM uses for `--mamba-ssm-cache-dtype auto`
    /// when the family overrides it (Nemotron-H).
    pub ssm_dtype_on_auto: Option<Dtype>,
}

impl ModelArch {
    /// Whether the model has mamba state besides attention (vLLM aligns its
    /// block size).
    pub fn is_hybrid(&self) -> bool {
        self.mamba.is_some()
    }

    /// Read a config of a supported family.
    pub fn from_config(config: &HfConfig) -> Result<ModelArch, DeriveError> {
        let family = Family::from_model_type(&config.model_type).ok_or_else(|| {
            DeriveError::UnknownModelType {
                source_name: config.source.clone(),
                model_type: config.model_type.clone(),
                supported: Family::supported_list(),
            }
        })?;
        let dtype = model_dtype(config)?;
        match family {
            Family::Qwen3Next => qwen3_next(config, dtype),
            Family::NemotronH => nemotron_h(config, dtype),
            Family::KimiLinear => kimi_linear(config, dtype),
            Family::FalconH1 => falcon_h1(config, dtype),
            Family::GraniteMoeHybrid => granite(config, dtype),
            Family::Jamba => jamba(config, dtype),
            Family::Zamba2 => zamba2(config, dtype),
            Family::DeepseekV3 => Ok(ModelArch {
                family,
                dtype,
                attention: mla_attention(config)?,
                mamba: None,
                attention_layers: config.positive("num_hidden_layers", "the layer count")?,
                mamba_layers: 0,
                mamba_first: false,
                ssm_dtype_on_auto: None,
            }),
            Family::Llama => Ok(ModelArch {
                family,
                dtype,
                attention: full_attention(config, None)?,
                mamba: None,
                attention_layers: config.positive("num_hidden_layers", "the layer count")?,
                mamba_layers: 0,
                mamba_first: false,
                ssm_dtype_on_auto: None,
            }),
        }
    }
}

/// `torch_dtype` (or transformers 5's `dtype`); vLLM's `--dtype auto` runs a
/// float32 (or unset, which transformers reads as float32) config in
/// bfloat16 on CUDA.
fn model_dtype(config: &HfConfig) -> Result<Dtype, DeriveError> {
    let field = if config.value("torch_dtype").is_some() {
        "torch_dtype"
    } else {
        "dtype"
    };
    match config.opt_str(field)? {
        None | Some("float32") => Ok(Dtype::Bf16),
        Some("bfloat16") => Ok(Dtype::Bf16),
        Some("float16") => Ok(Dtype::Fp16),
        Some(_) => Err(config.bad(
            field,
            "bfloat16, float16 or float32",
            config.value(field).unwrap_or(&serde_json::Value::Null),
        )),
    }
}

const HEADS_WHY: &str = "the attention head count";
const HIDDEN_WHY: &str = "the hidden size";

/// GQA attention: `num_key_value_heads` (default: the attention heads);
/// `head_dim` when set and positive, else `hidden_size / num_attention_heads`
/// (vLLM's `get_head_size`), unless the family fixes it.
fn full_attention(config: &HfConfig, head_size: Option<u64>) -> Result<AttentionArch, DeriveError> {
    let num_attention_heads = config.positive("num_attention_heads", HEADS_WHY)?;
    let total_kv_heads = config
        .opt_positive("num_key_value_heads")?
        .unwrap_or(num_attention_heads);
    let head_size = match head_size {
        Some(h) => h,
        None => match config.opt_count("head_dim")? {
            Some(h) if h > 0 => h,
            _ => config.positive("hidden_size", HIDDEN_WHY)? / num_attention_heads,
        },
    };
    if head_size == 0 {
        return Err(DeriveError::Unsupported(format!(
            "{}: the attention head size is 0",
            config.source
        )));
    }
    Ok(AttentionArch::Full {
        num_attention_heads,
        total_kv_heads,
        head_size,
    })
}

fn mla_attention(config: &HfConfig) -> Result<AttentionArch, DeriveError> {
    Ok(AttentionArch::Mla {
        num_attention_heads: config.positive("num_attention_heads", HEADS_WHY)?,
        kv_lora_rank: config.positive("kv_lora_rank", "the MLA latent width")?,
        qk_rope_head_dim: config.positive("qk_rope_head_dim", "the MLA latent width")?,
    })
}

fn conv_kernel(config: &HfConfig, field: &str) -> Result<u64, DeriveError> {
    let k = config.positive(field, "the conv state rows (kernel - 1)")?;
    if k < 2 {
        return Err(config.bad(field, "at least 2", &serde_json::json!(k)));
    }
    Ok(k)
}

fn qwen3_next(config: &HfConfig, dtype: Dtype) -> Result<ModelArch, DeriveError> {
    let layers = config.positive("num_hidden_layers", "the layer count")?;
    let kinds: Vec<bool> = match config.opt_str_list("layer_types")? {
        Some(types) => types.iter().map(|t| t == "full_attention").collect(),
        None => {
            // transformers' default: every `full_attention_interval`-th layer is full attention.
            let interval = config.opt_positive("full_attention_interval")?.unwrap_or(4);
            (0..layers).map(|i| (i + 1) % interval == 0).collect()
        }
    };
    let attention_layers = kinds.iter().filter(|a| **a).count() as u64;
    Ok(ModelArch {
        family: Family::Qwen3Next,
        dtype,
        attention: full_attention(config, None)?,
        mamba: Some(MambaArch::Gdn {
            num_k_heads: config.positive("linear_num_key_heads", "the GDN conv and state")?,
            num_v_heads: config.positive("linear_num_value_heads", "the GDN conv and state")?,
            head_k_dim: config.positive("linear_key_head_dim", "the GDN conv and state")?,
            head_v_dim: config.positive("linear_value_head_dim", "the GDN conv and state")?,
            conv_kernel: conv_kernel(config, "linear_conv_kernel_dim")?,
        }),
        attention_layers,
        mamba_layers: kinds.len() as u64 - attention_layers,
        mamba_first: kinds.first() == Some(&false),
        ssm_dtype_on_auto: None,
    })
}

fn mamba2_from(
    config: &HfConfig,
    intermediate_size: u64,
    fields: [&str; 5],
) -> Result<MambaArch, DeriveError> {
    const WHY: &str = "the Mamba2 conv and SSM state";
    let [groups, heads, head_dim, state, kernel] = fields;
    Ok(MambaArch::Mamba2 {
        intermediate_size,
        n_groups: config.positive(groups, WHY)?,
        num_heads: config.positive(heads, WHY)?,
        head_dim: config.positive(head_dim, WHY)?,
        state_size: config.positive(state, WHY)?,
        conv_kernel: conv_kernel(config, kernel)?,
    })
}

fn nemotron_h(config: &HfConfig, dtype: Dtype) -> Result<ModelArch, DeriveError> {
    let (attention_layers, mamba_layers, mamba_first) =
        match config.opt_str("hybrid_override_pattern")? {
            Some(pattern) => {
                let kinds: Vec<char> = pattern.chars().filter(|c| matches!(c, 'M' | '*')).collect();
                let attention = kinds.iter().filter(|c| **c == '*').count() as u64;
                (
                    attention,
                    kinds.len() as u64 - attention,
                    kinds.first() == Some(&'M'),
                )
            }
            None => {
                let types = config.opt_str_list("layers_block_type")?.ok_or_else(|| {
                    DeriveError::MissingField {
                        source_name: config.source.clone(),
                        model_type: config.model_type.clone(),
                        field: "hybrid_override_pattern".into(),
                        why: "which layers are mamba and which attention",
                    }
                })?;
                let kv: Vec<&String> = types
                    .iter()
                    .filter(|t| t.as_str() == "mamba" || t.as_str() == "attention")
                    .collect();
                let attention = kv.iter().filter(|t| t.as_str() == "attention").count() as u64;
                (
                    attention,
                    kv.len() as u64 - attention,
                    kv.first().is_some_and(|t| t.as_str() == "mamba"),
                )
            }
        };
    let heads = config.positive("mamba_num_heads", "the Mamba2 conv and SSM state")?;
    let head_dim = config.positive("mamba_head_dim", "the Mamba2 conv and SSM state")?;
    let ssm_dtype_on_auto = match config.opt_str("mamba_ssm_cache_dtype")? {
        None => Some(Dtype::F32),
        Some(name) => Some(Dtype::from_mamba_name(name).ok_or_else(|| {
            config.bad(
                "mamba_ssm_cache_dtype",
                "float32, float16 or bfloat16",
                config
                    .value("mamba_ssm_cache_dtype")
                    .unwrap_or(&serde_json::Value::Null),
            )
        })?),
    };
    let attention = match config.opt_positive("attention_head_dim")? {
        Some(h) if config.opt_count("head_dim")?.unwrap_or(0) == 0 => {
            full_attention(config, Some(h))?
        }
        _ => full_attention(config, None)?,
    };
    Ok(ModelArch {
        family: Family::NemotronH,
        dtype,
        attention,
        mamba: Some(mamba2_from(
            config,
            heads * head_dim,
            [
                "n_groups",
                "mamba_num_heads",
                "mamba_head_dim",
                "ssm_state_size",
                "conv_kernel",
            ],
        )?),
        attention_layers,
        mamba_layers,
        mamba_first,
        ssm_dtype_on_auto,
    })
}

fn kimi_linear(config: &HfConfig, dtype: Dtype) -> Result<ModelArch, DeriveError> {
    const WHY: &str = "the KDA layers and state";
    let linear = config.sub_config("linear_attn_config", WHY)?;
    let full = linear
        .opt_index_list("full_attn_layers")?
        .unwrap_or_default();
    let kda = linear.opt_index_list("kda_layers")?.unwrap_or_default();
    let mamba_first = match (full.iter().min(), kda.iter().min()) {
        (Some(a), Some(m)) => m < a,
        (None, Some(_)) => true,
        _ => false,
    };
    Ok(ModelArch {
        family: Family::KimiLinear,
        dtype,
        attention: mla_attention(config)?,
        mamba: Some(MambaArch::Kda {
            num_heads: linear.positive("num_heads", WHY)?,
            head_dim: linear.positive("head_dim", WHY)?,
            conv_kernel: conv_kernel(&linear, "short_conv_kernel_size")?,
        }),
        attention_layers: full.len() as u64,
        mamba_layers: kda.len() as u64,
        mamba_first,
        ssm_dtype_on_auto: None,
    })
}

fn falcon_h1(config: &HfConfig, dtype: Dtype) -> Result<ModelArch, DeriveError> {
    let hidden = config.positive("hidden_size", HIDDEN_WHY)?;
    let intermediate = match config.opt_positive("mamba_d_ssm")? {
        Some(d) => d,
        None => {
            let expand = config.opt_number("mamba_expand")?.unwrap_or(2.0);
            (expand * hidden as f64) as u64
        }
    };
    let layers = config.positive("num_hidden_layers", "the layer count")?;
    Ok(ModelArch {
        family: Family::FalconH1,
        dtype,
        attention: full_attention(config, None)?,
        mamba: Some(mamba2_from(
            config,
            intermediate,
            [
                "mamba_n_groups",
                "mamba_n_heads",
                "mamba_d_head",
                "mamba_d_state",
                "mamba_d_conv",
            ],
        )?),
        attention_layers: layers,
        mamba_layers: layers,
        mamba_first: false,
        ssm_dtype_on_auto: None,
    })
}

/// Granite-4.0-H: transformers' `GraniteMoeHybridConfig` defaults apply to
/// fields the file leaves out (128 heads, 1 group, state 256, conv 4, expand
/// 2, head dim `expand * hidden / heads`).
fn granite(config: &HfConfig, dtype: Dtype) -> Result<ModelArch, DeriveError> {
    let hidden = config.positive("hidden_size", HIDDEN_WHY)?;
    let expand = config.opt_positive("mamba_expand")?.unwrap_or(2);
    let intermediate = expand * hidden;
    let heads = config.opt_positive("mamba_n_heads")?.unwrap_or(128);
    let head_dim = match config.value("mamba_d_head") {
        None => intermediate / heads,
        Some(serde_json::Value::String(s)) if s == "auto" => intermediate / heads,
        Some(_) => config.positive("mamba_d_head", "the Mamba2 SSM state")?,
    };
    let layers = config.positive("num_hidden_layers", "the layer count")?;
    let types = config
        .opt_str_list("layer_types")?
        .unwrap_or_else(|| vec!["mamba".to_string(); layers as usize]);
    let is_attention = |t: &str| t == "attention" || t == "full_attention";
    let attention_layers = types.iter().filter(|t| is_attention(t)).count() as u64;
    Ok(ModelArch {
        family: Family::GraniteMoeHybrid,
        dtype,
        attention: full_attention(config, None)?,
        mamba: Some(MambaArch::Mamba2 {
            intermediate_size: intermediate,
            n_groups: config.opt_positive("mamba_n_groups")?.unwrap_or(1),
            num_heads: heads,
            head_dim,
            state_size: config.opt_positive("mamba_d_state")?.unwrap_or(256),
            conv_kernel: config.opt_positive("mamba_d_conv")?.unwrap_or(4),
        }),
        attention_layers,
        mamba_layers: types.len() as u64 - attention_layers,
        mamba_first: types.first().is_some_and(|t| !is_attention(t)),
        ssm_dtype_on_auto: None,
    })
}

fn jamba(config: &HfConfig, dtype: Dtype) -> Result<ModelArch, DeriveError> {
    let hidden = config.positive("hidden_size", HIDDEN_WHY)?;
    let expand = config.positive("mamba_expand", "the Mamba1 conv and SSM state")?;
    let layers = config.positive("num_hidden_layers", "the layer count")?;
    let period = config.opt_positive("attn_layer_period")?.unwrap_or(8);
    let offset = config.opt_count("attn_layer_offset")?.unwrap_or(4);
    let attention_layers = (0..layers).filter(|i| i % period == offset).count() as u64;
    Ok(ModelArch {
        family: Family::Jamba,
        dtype,
        attention: full_attention(config, None)?,
        mamba: Some(MambaArch::Mamba1 {
            intermediate_size: expand * hidden,
            state_size: config.positive("mamba_d_state", "the Mamba1 SSM state")?,
            conv_kernel: conv_kernel(config, "mamba_d_conv")?,
        }),
        attention_layers,
        mamba_layers: layers - attention_layers,
        mamba_first: offset != 0,
        ssm_dtype_on_auto: None,
    })
}

/// Zamba2: transformers' `Zamba2Config` computes `attention_head_dim = 2 *
/// hidden / heads` and `mamba_headdim = expand * hidden / mamba heads`;
/// every "hybrid" layer runs the shared attention block (its own KV cache)
/// before its Mamba2 mixer; all layers have Mamba2 state.
fn zamba2(config: &HfConfig, dtype: Dtype) -> Result<ModelArch, DeriveError> {
    let hidden = config.positive("hidden_size", HIDDEN_WHY)?;
    let heads = config.opt_positive("num_attention_heads")?.unwrap_or(32);
    let expand = config.opt_positive("mamba_expand")?.unwrap_or(2);
    let mamba_heads = config.opt_positive("n_mamba_heads")?.unwrap_or(8);
    let intermediate = expand * hidden;
    let types =
        config
            .opt_str_list("layers_block_type")?
            .ok_or_else(|| DeriveError::MissingField {
                source_name: config.source.clone(),
                model_type: config.model_type.clone(),
                field: "layers_block_type".into(),
                why: "which layers run the shared attention block",
            })?;
    let attention_layers = types.iter().filter(|t| t.as_str() == "hybrid").count() as u64;
    Ok(ModelArch {
        family: Family::Zamba2,
        dtype,
        attention: AttentionArch::Full {
            num_attention_heads: heads,
            total_kv_heads: config.opt_positive("num_key_value_heads")?.unwrap_or(heads),
            head_size: 2 * hidden / heads,
        },
        mamba: Some(MambaArch::Mamba2 {
            intermediate_size: intermediate,
            n_groups: config.opt_positive("mamba_ngroups")?.unwrap_or(1),
            num_heads: mamba_heads,
            head_dim: intermediate / mamba_heads,
            state_size: config.opt_positive("mamba_d_state")?.unwrap_or(64),
            conv_kernel: config.opt_positive("mamba_d_conv")?.unwrap_or(4),
        }),
        attention_layers,
        mamba_layers: types.len() as u64,
        // vLLM builds the shared attention blocks (with every hybrid layer's
        // attention) before the layers, so the attention layers come first.
        mamba_first: false,
        ssm_dtype_on_auto: None,
    })
}
