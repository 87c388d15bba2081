//! One engine as a vLLM release would run it: a model config, TP, the
//! attention backend and the cache options give the per-rank sizes and the
//! blocks, under the release's rules ([`VllmRules`]).

use serde::Serialize;

use super::attention::AttentionSizes;
use super::backend::{
    select_common_block_size, supported_kernel_sizes, validate_configuration, AttentionContext,
    Backend, Gpu,
};
use super::block_size::{logical_block, BlockInputs};
use super::dtype::{CacheDtype, MambaDtype};
use super::error::DeriveError;
use super::families::ModelArch;
use super::mamba_state::{mamba_state, MambaState};
use super::rules::VllmRules;

/// The options of one engine (`vllm serve` flags).
#[derive(Clone, Copy, Debug)]
pub struct EngineOptions {
    /// Tensor-parallel size (`--tensor-parallel-size`); at least 1.
    pub tp: u64,
    /// The attention backend (`--attention-backend`).
    pub backend: Backend,
    /// The GPU generation the engine runs on.
    pub gpu: Gpu,
    /// `--block-size`; `None` lets vLLM choose.
    pub block_size: Option<u64>,
    /// The attention KV cache dtype (`--kv-cache-dtype`).
    pub cache_dtype: CacheDtype,
    /// `--mamba-cache-dtype`: the mamba conv state's dtype, and the SSM
    /// state's when `mamba_ssm_cache_dtype` is `auto` and the family does
    /// not fix it.
    pub mamba_cache_dtype: MambaDtype,
    /// `--mamba-ssm-cache-dtype`: the mamba SSM (temporal) state's dtype.
    pub mamba_ssm_cache_dtype: MambaDtype,
    /// The release whose rules apply (`--release`).
    pub rules: &'static VllmRules,
}

impl EngineOptions {
    /// A `tp`-way engine on `backend` with every other option at its
    /// default: sm90, no `--block-size`, `auto` for all three dtypes, and
    /// the pinned release's rules.
    pub fn new(tp: u64, backend: Backend) -> Self {
        EngineOptions {
            tp,
            backend,
            gpu: Gpu::Sm90,
            block_size: None,
            cache_dtype: CacheDtype::Auto,
            mamba_cache_dtype: MambaDtype::Auto,
            mamba_ssm_cache_dtype: MambaDtype::Auto,
            rules: VllmRules::pinned(),
        }
    }
}

/// What a vLLM release computes for one engine. Sizes are of one rank and one layer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct EngineDerivation {
    /// The vLLM release whose rules were applied (`--release`).
    pub vllm_release: &'static str,
    /// The config's HF `model_type`.
    pub model_type: String,
    /// Tensor-parallel size.
    pub tp: u64,
    /// vLLM's name of the attention backend (e.g. `FLASH_ATTN`).
    pub backend: &'static str,
    /// The GPU generation: `sm90` or `sm100`.
    pub gpu: &'static str,
    /// `--block-size` as given.
    pub block_size_option: Option<u64>,
    /// The KV cache dtype as vLLM's `--kv-cache-dtype` names it.
    pub cache_dtype: &'static str,
    /// One rank's attention heads and bytes per token.
    pub attention: AttentionSizes,
    /// Bytes one token takes in one attention layer on one rank.
    pub attention_bytes_per_token: u64,
    /// One rank's mamba state shapes, dtypes and bytes; `None` without mamba.
    pub mamba: Option<MambaState>,
    /// One rank's mamba state (conv + SSM bytes); `None` without mamba.
    pub mamba_state_bytes: Option<u64>,
    /// The backend's kernel block sizes for this deployment.
    pub kernel_sizes: Vec<String>,
    /// The block before hybrid alignment (the backend's preference or `--block-size`).
    pub block_before_alignment: u64,
    /// Tokens per logical (scheduler) block, after the hybrid alignment.
    pub logical_block: u64,
    /// Tokens per kernel block: the logical block when the backend accepts
    /// it, else the backend's largest fixed size that divides it.
    pub kernel_block: u64,
    /// Kernel blocks per logical block.
    pub ppl: u64,
    /// One rank's page of one layer: `logical_block x attention bytes per
    /// token`, to which a hybrid's mamba state is padded.
    pub page_bytes: u64,
}

/// vLLM's TP checks on the attention heads: the query heads split evenly, and
/// KV heads are either sharded evenly or replicated a whole number of times.
fn check_heads(model: &ModelArch, tp: u64) -> Result<(), DeriveError> {
    let heads = model.attention.num_attention_heads();
    if heads % tp != 0 {
        return Err(DeriveError::refused(format!(
            "Total number of attention heads ({heads}) must be divisible by tensor parallel size ({tp})."
        )));
    }
    if let super::families::AttentionArch::Full { total_kv_heads, .. } = model.attention {
        let (n, d) = if tp >= total_kv_heads {
            (tp, total_kv_heads)
        } else {
            (total_kv_heads, tp)
        };
        if n % d != 0 {
            return Err(DeriveError::refused(format!("{n} is not divisible by {d}")));
        }
    }
    Ok(())
}

/// Derive one engine as the release of `options.rules` would start it: the TP checks on the
/// heads, the backend selector's checks, one rank's attention and mamba
/// sizes, and the logical and kernel blocks. Fails on a zero `--tp` or
/// `--block-size`, an fp8 cache on an MLA model, or a deployment vLLM
/// refuses ([`DeriveError::Refused`]).
pub fn derive_engine(
    model: &ModelArch,
    options: &EngineOptions,
) -> Result<EngineDerivation, DeriveError> {
    derive_under_rules(model, options).map_err(|e| e.in_release(options.rules.release))
}

fn derive_under_rules(
    model: &ModelArch,
    options: &EngineOptions,
) -> Result<EngineDerivation, DeriveError> {
    let tp = options.tp;
    if tp == 0 {
        return Err(DeriveError::ZeroOption { option: "--tp" });
    }
    if options.block_size == Some(0) {
        return Err(DeriveError::ZeroOption {
            option: "--block-size",
        });
    }
    check_heads(model, tp)?;
    if model.attention.is_mla() && options.cache_dtype == CacheDtype::Fp8 {
        return Err(DeriveError::Unsupported(
            "an fp8 KV cache on an MLA model packs the latent in a backend-specific \
             format that kvgeom does not model; use --cache-dtype auto, bf16 or fp16"
                .to_string(),
        ));
    }
    let attention = AttentionSizes::of(model, tp, options.cache_dtype);
    let ctx = AttentionContext {
        gpu: options.gpu,
        model_is_mla: model.attention.is_mla(),
        head_size: attention.head_size,
        q_heads_per_rank: model.attention.num_attention_heads() / tp,
        kv_heads_per_rank: attention.kv_heads_per_rank,
        cache_dtype: options.cache_dtype,
    };
    validate_configuration(options.backend, &ctx, options.block_size)?;
    let mamba = model
        .mamba
        .as_ref()
        .map(|arch| {
            mamba_state(
                model,
                arch,
                tp,
                options.mamba_cache_dtype,
                options.mamba_ssm_cache_dtype,
            )
        })
        .transpose()?;
    let sizes = supported_kernel_sizes(options.backend, &ctx);
    let per_token = attention.bytes_per_token;
    let choice = logical_block(&BlockInputs {
        kernel_sizes: &sizes,
        user_block: options.block_size,
        default_block: options.rules.default_block_size,
        is_mla: model.attention.is_mla(),
        attention_bytes_per_token: per_token,
        mamba_state_bytes: mamba.as_ref().map(|m| m.state_bytes),
    });
    let kernel = select_common_block_size(options.backend, &sizes, choice.logical)?;
    Ok(EngineDerivation {
        vllm_release: options.rules.release,
        model_type: model.family.model_type().to_string(),
        tp,
        backend: options.backend.name(),
        gpu: options.gpu.name(),
        block_size_option: options.block_size,
        cache_dtype: options.cache_dtype.vllm_name(),
        attention_bytes_per_token: per_token,
        mamba_state_bytes: mamba.as_ref().map(|m| m.state_bytes),
        mamba,
        attention,
        kernel_sizes: sizes.iter().map(ToString::to_string).collect(),
        block_before_alignment: choice.preferred,
        logical_block: choice.logical,
        kernel_block: kernel,
        ppl: choice.logical / kernel,
        page_bytes: choice.logical * per_token,
    })
}
