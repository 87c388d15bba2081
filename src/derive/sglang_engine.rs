//! One SGLang 0.5.23 engine at a given attention TP: the KV heads and head
//! dims of each rank and every state tensor of a linear layer, with what
//! SGLang's transfer is told about it (slice axis, dim per tensor, outer
//! count, conv sub-blocks).

use serde::Serialize;

use super::error::DeriveError;
use super::families::MambaArch;
use super::sglang_model::{SglangAttention, SglangModel};

/// One rank's attention KV cache.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum SglangRankAttention {
    /// K and V buffers per layer, `kv_heads_per_rank` heads each.
    Mha {
        /// KV heads over all ranks.
        total_kv_heads: u64,
        /// `max(1, total / attention TP)`: heads are replicated past the total.
        kv_heads_per_rank: u64,
        /// K's elements per head.
        head_dim: u64,
        /// V's elements per head.
        v_head_dim: u64,
    },
    /// One latent buffer per layer, whole on every rank.
    Mla {
        /// The compressed latent's width.
        kv_lora_rank: u64,
        /// The rotary key part's width.
        qk_rope_head_dim: u64,
    },
}

/// One state tensor of one linear layer on one rank (one request's slot).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SglangStateTensor {
    /// `conv` or `temporal`.
    pub name: &'static str,
    /// The slot's shape.
    pub shape: Vec<u64>,
    /// The dtype's name.
    pub dtype: &'static str,
    /// The axis of the slot sliced across attention TP.
    pub slice_axis: u64,
    /// The length of that axis on this rank.
    pub dim_per_tensor: u64,
    /// Rows before the slice axis (the product of the axes before it).
    pub outer_count: u64,
    /// The conv's sub-blocks over all ranks, each sliced on its own; `None`
    /// when the axis is sliced as one block.
    pub conv_shard_groups: Option<Vec<u64>>,
}

/// One rank's state of one linear layer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SglangRankState {
    /// The mixer: `mamba2`, `gdn` or `kda`.
    pub kind: &'static str,
    /// The conv kernel width.
    pub conv_kernel: u64,
    /// The conv tensor, then the temporal one.
    pub tensors: Vec<SglangStateTensor>,
}

/// One engine as SGLang 0.5.23 builds it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SglangEngine {
    /// Always `sglang`.
    pub stack: &'static str,
    /// The config's `model_type`.
    pub model_type: &'static str,
    /// The attention TP.
    pub attn_tp: u64,
    /// One rank's attention KV cache.
    pub attention: SglangRankAttention,
    /// The layer ids with an attention KV cache.
    pub attention_layers: Vec<u64>,
    /// The layer ids with a linear state.
    pub linear_layers: Vec<u64>,
    /// One rank's state per linear layer; absent for attention-only models.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state: Option<SglangRankState>,
}

/// An exact share, or SGLang's refusal.
fn share(total: u64, tp: u64, what: &str) -> Result<u64, DeriveError> {
    if total % tp == 0 {
        Ok(total / tp)
    } else {
        Err(DeriveError::SglangRefused {
            reason: format!("{what} {total} is not divisible by the attention TP {tp}"),
        })
    }
}

fn sliced_first(name: &'static str, shape: Vec<u64>, dtype: &'static str) -> SglangStateTensor {
    SglangStateTensor {
        name,
        dim_per_tensor: shape[0],
        shape,
        dtype,
        slice_axis: 0,
        outer_count: 1,
        conv_shard_groups: None,
    }
}

/// The conv and temporal shapes of Mamba2's layout (GDN uses it too, with
/// key heads as groups): groups are replicated up to the TP when it does
/// not divide them; the conv holds `x` and B, C of every group.
fn mamba2_layout(
    tp: u64,
    intermediate_size: u64,
    n_groups: u64,
    num_heads: u64,
    head_dim: u64,
    state_size: u64,
) -> Result<(u64, [u64; 3]), DeriveError> {
    let groups = if n_groups % tp == 0 { n_groups } else { tp };
    let conv_dim = intermediate_size + 2 * groups * state_size;
    Ok((
        share(conv_dim, tp, "the conv channels")?,
        [
            share(num_heads, tp, "the state heads")?,
            head_dim,
            state_size,
        ],
    ))
}

/// KV heads each rank holds: the heads split evenly over the ranks, or,
/// with more ranks than heads, one head replicated over an even share of
/// the ranks; SGLang's attention layers refuse any other TP.
fn kv_heads_per_rank(total: u64, tp: u64) -> Result<u64, DeriveError> {
    if total >= tp {
        share(total, tp, "the KV head count")
    } else if tp % total == 0 {
        Ok(1)
    } else {
        Err(DeriveError::SglangRefused {
            reason: format!(
                "attention TP {tp} is not a multiple of the KV head count {total} (a KV head is replicated over a whole share of the ranks)"
            ),
        })
    }
}

/// Derive one engine at attention TP `tp`.
pub fn derive_sglang_engine(model: &SglangModel, tp: u64) -> Result<SglangEngine, DeriveError> {
    if tp == 0 {
        return Err(DeriveError::ZeroOption { option: "--tp" });
    }
    if tp > u64::from(crate::limits::MAX_TP_SIZE) {
        return Err(DeriveError::Unsupported(format!(
            "attention TP {tp} is above kvgeom's limit of {} ranks per engine",
            crate::limits::MAX_TP_SIZE
        )));
    }
    let attention = match model.attention {
        SglangAttention::Full {
            total_kv_heads,
            head_dim,
            v_head_dim,
        } => SglangRankAttention::Mha {
            total_kv_heads,
            kv_heads_per_rank: kv_heads_per_rank(total_kv_heads, tp)?,
            head_dim,
            v_head_dim,
        },
        SglangAttention::Mla {
            kv_lora_rank,
            qk_rope_head_dim,
        } => SglangRankAttention::Mla {
            kv_lora_rank,
            qk_rope_head_dim,
        },
    };
    let state = match &model.linear {
        None => None,
        Some(linear) => {
            let k = linear.mixer.conv_kernel() - 1;
            let temporal_dtype = linear.temporal_dtype;
            let (kind, conv, temporal) = match linear.mixer {
                MambaArch::Mamba2 {
                    state_size,
                    head_dim,
                    num_heads,
                    n_groups,
                    intermediate_size,
                    ..
                } => {
                    let (c, t) = mamba2_layout(
                        tp,
                        intermediate_size,
                        n_groups,
                        num_heads,
                        head_dim,
                        state_size,
                    )?;
                    (
                        "mamba2",
                        sliced_first("conv", vec![c, k], "bfloat16"),
                        t.to_vec(),
                    )
                }
                MambaArch::Gdn {
                    num_k_heads,
                    head_k_dim,
                    num_v_heads,
                    head_v_dim,
                    ..
                } => {
                    let key = num_k_heads * head_k_dim;
                    let value = num_v_heads * head_v_dim;
                    let (c, t) =
                        mamba2_layout(tp, value, num_k_heads, num_v_heads, head_v_dim, head_k_dim)?;
                    let mut conv = sliced_first("conv", vec![c, k], "bfloat16");
                    conv.conv_shard_groups = Some(vec![key, key, value]);
                    ("gdn", conv, t.to_vec())
                }
                MambaArch::Kda {
                    num_heads,
                    head_dim,
                    ..
                } => {
                    let proj = num_heads * head_dim;
                    let per_rank = share(proj, tp, "the KDA projection channels")?;
                    let channels = 3 * per_rank;
                    let conv = SglangStateTensor {
                        name: "conv",
                        shape: vec![k, channels],
                        dtype: "bfloat16",
                        slice_axis: 1,
                        dim_per_tensor: channels,
                        outer_count: k,
                        conv_shard_groups: Some(vec![proj, proj, proj]),
                    };
                    let heads = share(num_heads, tp, "the KDA heads")?;
                    ("kda", conv, vec![heads, head_dim, head_dim])
                }
                MambaArch::Mamba1 { .. } => {
                    return Err(DeriveError::Unsupported(
                        "a Mamba1 state: SGLang 0.5.23 runs no Mamba1 model".into(),
                    ))
                }
            };
            Some(SglangRankState {
                kind,
                conv_kernel: linear.mixer.conv_kernel(),
                tensors: vec![conv, sliced_first("temporal", temporal, temporal_dtype)],
            })
        }
    };
    Ok(SglangEngine {
        stack: "sglang",
        model_type: model.family.model_type(),
        attn_tp: tp,
        attention,
        attention_layers: model.attention_layers.clone(),
        linear_layers: model.linear_layers.clone(),
        state,
    })
}
