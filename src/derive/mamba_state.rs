//! One rank's mamba state, as vLLM 0.33.0's `MambaStateShapeCalculator` and
//! `MambaStateDtypeCalculator` size it: the conv state (in the channel-first
//! "DS" layout the NIXL connector requires; the bytes are the same in either
//! layout) and the temporal (SSM / recurrent) state.

use serde::Serialize;

use super::dtype::{Dtype, MambaDtype};
use super::error::DeriveError;
use super::families::{MambaArch, ModelArch};

/// One rank's state of one mamba layer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MambaState {
    /// The state's kind: `mamba1`, `mamba2`, `gdn` or `kda`.
    pub kind: &'static str,
    /// Conv state shape `[channels, kernel - 1]` of one rank.
    pub conv_shape: [u64; 2],
    /// The conv channels of one rank split into the sub-projections the
    /// connector transfers separately (x | B | C, Q | K | V, or one).
    pub conv_split: Vec<u64>,
    /// The conv state's dtype name (e.g. `bfloat16`).
    pub conv_dtype: &'static str,
    /// Bytes of one rank's conv state: channels x (kernel - 1) x dtype bytes.
    pub conv_bytes: u64,
    /// Temporal state shape of one rank.
    pub ssm_shape: Vec<u64>,
    /// The temporal state's dtype name (e.g. `float32`).
    pub ssm_dtype: &'static str,
    /// Bytes of one rank's temporal state: the product of its shape x dtype
    /// bytes.
    pub ssm_bytes: u64,
    /// Mamba2 only: groups after replication for head shards
    /// (`n_groups + (tp - n_groups)` when TP does not divide them).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub groups_after_replication: Option<u64>,
    /// conv + SSM bytes: vLLM's `MambaSpec.page_size_bytes` before padding.
    pub state_bytes: u64,
}

/// vLLM's `divide`: an exact quotient or its assertion message.
fn divide(numerator: u64, denominator: u64) -> Result<u64, DeriveError> {
    if numerator % denominator == 0 {
        Ok(numerator / denominator)
    } else {
        Err(DeriveError::refused(format!(
            "{numerator} is not divisible by {denominator}"
        )))
    }
}

/// vLLM's `extra_groups_for_head_shards`.
pub fn extra_groups_for_head_shards(n_groups: u64, tp: u64) -> u64 {
    if n_groups % tp == 0 {
        0
    } else {
        tp - n_groups
    }
}

/// Conv and temporal dtypes for the family and the two options.
fn state_dtypes(
    model: &ModelArch,
    arch: &MambaArch,
    mamba_cache: MambaDtype,
    mamba_ssm_cache: MambaDtype,
) -> Result<(Dtype, Dtype), DeriveError> {
    let conv = match mamba_cache {
        MambaDtype::Auto => model.dtype,
        MambaDtype::Is(d) => d,
    };
    // Nemotron-H replaces `auto` before the state is sized.
    let ssm_option = match (mamba_ssm_cache, model.ssm_dtype_on_auto) {
        (MambaDtype::Auto, Some(d)) => MambaDtype::Is(d),
        (option, _) => option,
    };
    let ssm = match (arch, ssm_option) {
        (MambaArch::Kda { .. }, MambaDtype::Auto) => Dtype::F32,
        (MambaArch::Kda { .. }, MambaDtype::Is(Dtype::Fp16)) => {
            return Err(DeriveError::refused(
                "KDA recurrent state supports only auto, float32, and bfloat16; got float16",
            ))
        }
        (_, MambaDtype::Auto) => conv,
        (_, MambaDtype::Is(d)) => d,
    };
    Ok((conv, ssm))
}

/// One rank's state at `tp`.
pub fn mamba_state(
    model: &ModelArch,
    arch: &MambaArch,
    tp: u64,
    mamba_cache: MambaDtype,
    mamba_ssm_cache: MambaDtype,
) -> Result<MambaState, DeriveError> {
    let (conv_dtype, ssm_dtype) = state_dtypes(model, arch, mamba_cache, mamba_ssm_cache)?;
    let mut groups_after_replication = None;
    let (conv_split, conv_kernel, ssm_shape) = match *arch {
        MambaArch::Mamba1 {
            intermediate_size,
            state_size,
            conv_kernel,
        } => {
            let dim = divide(intermediate_size, tp)?;
            (vec![dim], conv_kernel, vec![dim, state_size])
        }
        MambaArch::Mamba2 {
            intermediate_size,
            n_groups,
            num_heads,
            head_dim,
            state_size,
            conv_kernel,
        } => {
            let groups = n_groups + extra_groups_for_head_shards(n_groups, tp);
            groups_after_replication = Some(groups);
            let conv_dim = intermediate_size + 2 * groups * state_size;
            let total = divide(conv_dim, tp)?;
            let heads = divide(num_heads, tp)?;
            // x | B | C of one rank: B and C are each groups * state / tp.
            let bc = groups * state_size / tp;
            (
                vec![total - 2 * bc, bc, bc],
                conv_kernel,
                vec![heads, head_dim, state_size],
            )
        }
        MambaArch::Gdn {
            num_k_heads,
            num_v_heads,
            head_k_dim,
            head_v_dim,
            conv_kernel,
        } => {
            let conv_dim = head_k_dim * num_k_heads * 2 + head_v_dim * num_v_heads;
            let total = divide(conv_dim, tp)?;
            let heads = divide(num_v_heads, tp)?;
            let qk = head_k_dim * num_k_heads / tp;
            (
                vec![qk, qk, total - 2 * qk],
                conv_kernel,
                vec![heads, head_v_dim, head_k_dim],
            )
        }
        MambaArch::Kda {
            num_heads,
            head_dim,
            conv_kernel,
        } => {
            // 0.33.0: one conv tensor holding Q | K | V.
            let total = divide(3 * num_heads * head_dim, tp)?;
            let heads = divide(num_heads, tp)?;
            let part = total / 3;
            (
                vec![part, part, part],
                conv_kernel,
                vec![heads, head_dim, head_dim],
            )
        }
    };
    let channels: u64 = conv_split.iter().sum();
    let rows = conv_kernel - 1;
    let conv_bytes = channels * rows * conv_dtype.bytes();
    let ssm_bytes = ssm_shape.iter().product::<u64>() * ssm_dtype.bytes();
    Ok(MambaState {
        kind: arch.kind_name(),
        conv_shape: [channels, rows],
        conv_split,
        conv_dtype: conv_dtype.name(),
        conv_bytes,
        ssm_shape,
        ssm_dtype: ssm_dtype.name(),
        ssm_bytes,
        groups_after_replication,
        state_bytes: conv_bytes + ssm_bytes,
    })
}
