//! Attention backends of vLLM 0.33.0 on CUDA: the kernel block sizes each
//! accepts, the checks its selector runs on a deployment, and
//! `select_common_block_size`, which picks the kernel block for a logical
//! block.

use std::fmt;

use super::dtype::CacheDtype;
use super::error::DeriveError;

/// The GPU generation: some backends exist only on one, and some kernel
/// sizes depend on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Gpu {
    /// Hopper (compute capability 9.0).
    #[default]
    Sm90,
    /// Blackwell (compute capability 10.0).
    Sm100,
}

impl Gpu {
    /// Parse `--gpu`, case-insensitive: `sm90`, `hopper`, `h100` or `h200`
    /// for Hopper, `sm100`, `blackwell` or `b200` for Blackwell; anything
    /// else is [`DeriveError::UnknownGpu`].
    pub fn parse(name: &str) -> Result<Gpu, DeriveError> {
        match name.to_ascii_lowercase().as_str() {
            "sm90" | "hopper" | "h100" | "h200" => Ok(Gpu::Sm90),
            "sm100" | "blackwell" | "b200" => Ok(Gpu::Sm100),
            _ => Err(DeriveError::UnknownGpu {
                name: name.to_string(),
            }),
        }
    }

    /// The name messages and reports use: `sm90` or `sm100`.
    pub fn name(self) -> &'static str {
        match self {
            Gpu::Sm90 => "sm90",
            Gpu::Sm100 => "sm100",
        }
    }

    fn major(self) -> u32 {
        match self {
            Gpu::Sm90 => 9,
            Gpu::Sm100 => 10,
        }
    }
}

/// A vLLM 0.33.0 attention backend on CUDA (`--attention-backend`): the
/// first three serve GQA/MHA models, the MLA ones only MLA models.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// `FLASH_ATTN`: FlashAttention, kernel blocks `MultipleOf(16)` (exactly
    /// 128 for head size 256 on sm100); vLLM's default for GQA on sm90.
    FlashAttn,
    /// `FLASHINFER`: FlashInfer, kernel blocks 16, 32 or 64 (also 128 to 1024
    /// on sm100 with the TRTLLM kernels); vLLM's default for GQA on sm100.
    FlashInfer,
    /// `TRITON_ATTN`: the Triton attention kernels, kernel blocks
    /// `MultipleOf(16)`; vLLM's fallback.
    TritonAttn,
    /// `FLASHMLA`: FlashMLA (sm90 and sm100), kernel block 64 only.
    FlashMla,
    /// `CUTLASS_MLA`: CUTLASS MLA (sm100 only), kernel block 128 only.
    CutlassMla,
    /// `FLASHINFER_MLA`: FlashInfer's MLA kernels (sm100 only), kernel blocks
    /// 32 or 64.
    FlashInferMla,
    /// `FLASH_ATTN_MLA`: FlashAttention's MLA kernels (sm90 only), kernel
    /// blocks `MultipleOf(16)`.
    FlashAttnMla,
}

impl Backend {
    /// Every backend, in the order the unknown-backend message lists them.
    pub const ALL: [Backend; 7] = [
        Backend::FlashAttn,
        Backend::FlashInfer,
        Backend::TritonAttn,
        Backend::FlashMla,
        Backend::CutlassMla,
        Backend::FlashInferMla,
        Backend::FlashAttnMla,
    ];

    /// vLLM's `get_name()`.
    pub fn name(self) -> &'static str {
        match self {
            Backend::FlashAttn => "FLASH_ATTN",
            Backend::FlashInfer => "FLASHINFER",
            Backend::TritonAttn => "TRITON_ATTN",
            Backend::FlashMla => "FLASHMLA",
            Backend::CutlassMla => "CUTLASS_MLA",
            Backend::FlashInferMla => "FLASHINFER_MLA",
            Backend::FlashAttnMla => "FLASH_ATTN_MLA",
        }
    }

    /// Case-insensitive; `-` may stand for `_`.
    pub fn parse(name: &str) -> Result<Backend, DeriveError> {
        let wanted = name.to_ascii_uppercase().replace('-', "_");
        Backend::ALL
            .into_iter()
            .find(|b| b.name() == wanted)
            .ok_or_else(|| DeriveError::UnknownBackend {
                name: name.to_string(),
                supported: Backend::ALL.iter().map(|b| b.name()).collect(),
            })
    }

    /// Whether the backend is an MLA backend; the selector refuses an MLA
    /// backend for a non-MLA model and the reverse.
    pub fn is_mla(self) -> bool {
        matches!(
            self,
            Backend::FlashMla
                | Backend::CutlassMla
                | Backend::FlashInferMla
                | Backend::FlashAttnMla
        )
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One entry of `get_supported_kernel_block_sizes`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelSize {
    /// Exactly this many tokens per kernel block (a plain `int` entry).
    Exact(u64),
    /// Any multiple of this many tokens (vLLM's `MultipleOf`).
    MultipleOf(u64),
}

impl KernelSize {
    /// The entry's token count: the exact size, or the base of a `MultipleOf`.
    pub fn base(self) -> u64 {
        match self {
            KernelSize::Exact(n) | KernelSize::MultipleOf(n) => n,
        }
    }
}

impl fmt::Display for KernelSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KernelSize::Exact(n) => write!(f, "{n}"),
            KernelSize::MultipleOf(n) => write!(f, "MultipleOf({n})"),
        }
    }
}

/// What the backend checks look at: one rank's attention as the selector sees it.
#[derive(Clone, Copy, Debug)]
pub struct AttentionContext {
    /// The GPU generation the engine runs on.
    pub gpu: Gpu,
    /// Whether the model's attention is MLA (one replicated latent per token).
    pub model_is_mla: bool,
    /// Elements per head as vLLM's `get_head_size` reports it: for MLA the
    /// latent width `kv_lora_rank + qk_rope_head_dim`.
    pub head_size: u64,
    /// Query heads of one rank (`num_attention_heads / tp`).
    pub q_heads_per_rank: u64,
    /// KV heads of one rank.
    pub kv_heads_per_rank: u64,
    /// The attention KV cache dtype (fp8 rules out FA4's 128-token blocks).
    pub cache_dtype: CacheDtype,
}

/// The backend's kernel block sizes for this deployment.
pub fn supported_kernel_sizes(backend: Backend, ctx: &AttentionContext) -> Vec<KernelSize> {
    use KernelSize::{Exact, MultipleOf};
    match backend {
        // FA4 on Blackwell runs head size 256 on its dedicated kernel with
        // 128-token pages (unquantized KV only).
        Backend::FlashAttn
            if ctx.gpu == Gpu::Sm100
                && ctx.head_size == 256
                && ctx.cache_dtype != CacheDtype::Fp8 =>
        {
            vec![Exact(128)]
        }
        Backend::FlashAttn | Backend::TritonAttn | Backend::FlashAttnMla => vec![MultipleOf(16)],
        Backend::FlashInfer => {
            // Pages of 128 and more run on the TRTLLM kernels: Blackwell, GQA
            // with more than one query head per KV head on the rank.
            let large = ctx.gpu == Gpu::Sm100
                && ctx.kv_heads_per_rank > 0
                && ctx.q_heads_per_rank / ctx.kv_heads_per_rank > 1
                && ctx.q_heads_per_rank % ctx.kv_heads_per_rank == 0;
            let mut sizes = vec![Exact(16), Exact(32), Exact(64)];
            if large {
                sizes.extend([128, 256, 512, 1024].map(Exact));
            }
            sizes
        }
        Backend::FlashMla => vec![Exact(64)],
        Backend::CutlassMla => vec![Exact(128)],
        Backend::FlashInferMla => vec![Exact(32), Exact(64)],
    }
}

/// The smallest kernel size (a `MultipleOf` counts as its base).
pub fn smallest_kernel_size(sizes: &[KernelSize]) -> u64 {
    sizes.iter().map(|s| s.base()).min().unwrap_or(1)
}

/// vLLM's `supports_block_size`: a multiple of some entry's base.
pub fn supports_block_size(sizes: &[KernelSize], block: u64) -> bool {
    sizes.is_empty() || sizes.iter().any(|s| block % s.base() == 0)
}

/// vLLM's `get_preferred_block_size(16)`.
pub fn preferred_block_size(sizes: &[KernelSize], default: u64) -> u64 {
    if supports_block_size(sizes, default) {
        default
    } else {
        smallest_kernel_size(sizes)
    }
}

fn is_exactly_supported(sizes: &[KernelSize], block: u64) -> bool {
    sizes.iter().any(|s| match s {
        KernelSize::Exact(n) => *n == block,
        KernelSize::MultipleOf(n) => block % n == 0,
    })
}

fn sizes_list(sizes: &[KernelSize]) -> String {
    let items: Vec<String> = sizes.iter().map(ToString::to_string).collect();
    format!("[{}]", items.join(", "))
}

/// vLLM's `select_common_block_size` for one backend: the logical block
/// itself when the backend takes it, else the largest exact size dividing it.
pub fn select_common_block_size(
    backend: Backend,
    sizes: &[KernelSize],
    logical: u64,
) -> Result<u64, DeriveError> {
    if is_exactly_supported(sizes, logical) {
        return Ok(logical);
    }
    sizes
        .iter()
        .filter_map(|s| match s {
            KernelSize::Exact(n) if logical % n == 0 => Some(*n),
            _ => None,
        })
        .max()
        .ok_or_else(|| {
            DeriveError::refused(format!(
                "No common block size for {logical} ({}: {}).",
                backend.name(),
                sizes_list(sizes)
            ))
        })
}

/// The selector's `validate_configuration` for a backend picked with
/// `--attention-backend`; `user_block` is `--block-size` when given.
pub fn validate_configuration(
    backend: Backend,
    ctx: &AttentionContext,
    user_block: Option<u64>,
) -> Result<(), DeriveError> {
    let mut reasons: Vec<&str> = Vec::new();
    let h = ctx.head_size;
    let head_ok = match backend {
        Backend::FlashAttn => h % 8 == 0 && h <= 256,
        Backend::FlashInfer => [64, 128, 256, 512].contains(&h),
        Backend::TritonAttn => h >= 32,
        Backend::FlashAttnMla => h == 576,
        Backend::FlashMla | Backend::CutlassMla | Backend::FlashInferMla => {
            [320, 512, 576].contains(&h)
        }
    };
    if !head_ok {
        reasons.push("head_size not supported");
    }
    if let Some(block) = user_block {
        if !supports_block_size(&supported_kernel_sizes(backend, ctx), block) {
            reasons.push("block_size not supported");
        }
    }
    if ctx.model_is_mla != backend.is_mla() {
        reasons.push(if ctx.model_is_mla {
            "MLA not supported"
        } else {
            "non-MLA not supported"
        });
    }
    let major = ctx.gpu.major();
    let capability_ok = match backend {
        Backend::FlashAttn | Backend::FlashInfer | Backend::TritonAttn => true,
        Backend::FlashMla => major == 9 || major == 10,
        Backend::CutlassMla | Backend::FlashInferMla => major == 10,
        Backend::FlashAttnMla => major == 9,
    };
    if !capability_ok {
        reasons.push("compute capability not supported");
    }
    if reasons.is_empty() {
        return Ok(());
    }
    let quoted: Vec<String> = reasons.iter().map(|r| format!("'{r}'")).collect();
    Err(DeriveError::refused(format!(
        "Selected backend AttentionBackendEnum.{} is not valid for this configuration. Reason: [{}] (on {})",
        backend.name(),
        quoted.join(", "),
        ctx.gpu.name()
    )))
}
