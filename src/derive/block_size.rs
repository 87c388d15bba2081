//! The logical (scheduler) block size: the backend's preferred size, or
//! `--block-size`, raised for a hybrid model until one attention page holds
//! a rank's mamba state (vLLM's `update_block_size_for_backend` and
//! `_align_hybrid_block_size`, prefix caching off; equal in 0.33.0 and
//! 0.34.0 but for the default block they start from).

use super::backend::{preferred_block_size, smallest_kernel_size, KernelSize};

/// The MLA-hybrid alignment: TRTLLM/FlashInfer MLA decode kernels want the
/// manager block to be a multiple of 128 tokens.
pub const MLA_HYBRID_ALIGNMENT: u64 = 128;

/// What the alignment looks at.
#[derive(Clone, Copy, Debug)]
pub struct BlockInputs<'a> {
    /// The backend's kernel block sizes for this deployment.
    pub kernel_sizes: &'a [KernelSize],
    /// `--block-size` in tokens, when given (a hybrid model may still raise it).
    pub user_block: Option<u64>,
    /// The release's `CacheConfig.DEFAULT_BLOCK_SIZE`, tried when
    /// `user_block` is `None`.
    pub default_block: u64,
    /// Whether the model is MLA: a hybrid MLA model aligns to at least
    /// [`MLA_HYBRID_ALIGNMENT`] tokens.
    pub is_mla: bool,
    /// Bytes one token takes in one attention layer on one rank.
    pub attention_bytes_per_token: u64,
    /// One rank's mamba state of one layer; `None` for a model without mamba.
    pub mamba_state_bytes: Option<u64>,
}

/// The block before alignment and the logical block after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockChoice {
    /// Tokens per block before alignment: `--block-size`, else the
    /// release's default block when the backend accepts it, else the
    /// backend's smallest kernel size.
    pub preferred: u64,
    /// Tokens per logical (scheduler) block after the hybrid alignment;
    /// `preferred` for a model without mamba state.
    pub logical: u64,
}

/// The logical block of one engine. For a hybrid model the alignment `A` is
/// the larger of the smallest kernel size and the preferred block (at least
/// 128 for MLA); the block grows to `A x ceil(mamba bytes / (A x attention
/// bytes per token))` tokens, rounded up to a multiple of the smallest
/// kernel size, so that one attention page holds a rank's mamba state.
pub fn logical_block(inputs: &BlockInputs) -> BlockChoice {
    let sizes = inputs.kernel_sizes;
    let block = inputs
        .user_block
        .unwrap_or_else(|| preferred_block_size(sizes, inputs.default_block));
    let Some(mamba) = inputs.mamba_state_bytes.filter(|m| *m > 0) else {
        return BlockChoice {
            preferred: block,
            logical: block,
        };
    };
    let smallest = smallest_kernel_size(sizes);
    let mut alignment = smallest.max(block);
    if inputs.is_mla {
        alignment = alignment.max(MLA_HYBRID_ALIGNMENT);
    }
    let per_token = inputs.attention_bytes_per_token.max(1);
    let aligned = alignment * mamba.div_ceil(alignment * per_token);
    // A multiple of every backend's smallest kernel block (one backend here).
    let aligned = smallest * aligned.div_ceil(smallest);
    BlockChoice {
        preferred: block,
        logical: block.max(aligned),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use KernelSize::{Exact, MultipleOf};

    fn hybrid(sizes: &[KernelSize], user: Option<u64>, mla: bool, bpt: u64, mamba: u64) -> u64 {
        logical_block(&BlockInputs {
            kernel_sizes: sizes,
            user_block: user,
            default_block: 16,
            is_mla: mla,
            attention_bytes_per_token: bpt,
            mamba_state_bytes: Some(mamba),
        })
        .logical
    }

    #[test]
    fn worked_values_of_the_rule() {
        // vllm-block-size-rule.md section 6: Qwen3-Next TP1, Kimi-Linear TP1/TP2/TP8.
        assert_eq!(hybrid(&[MultipleOf(16)], None, false, 2048, 1_097_728), 544);
        assert_eq!(hybrid(&[Exact(64)], None, true, 1152, 2_170_880), 1920);
        assert_eq!(hybrid(&[Exact(128)], None, true, 1152, 1_085_440), 1024);
        assert_eq!(hybrid(&[Exact(64)], None, true, 1152, 271_360), 256);
        // Qwen3-Next TP2 and TP4 with --block-size 64 on FlashInfer.
        let fi = [Exact(16), Exact(32), Exact(64)];
        assert_eq!(hybrid(&fi, Some(64), false, 1024, 548_864), 576);
        assert_eq!(hybrid(&fi, Some(64), false, 1024, 274_432), 320);
    }

    #[test]
    fn a_larger_user_block_is_kept() {
        assert_eq!(
            hybrid(&[MultipleOf(16)], Some(2048), false, 2048, 1_097_728),
            2048
        );
    }

    #[test]
    fn without_mamba_the_preferred_size_stands() {
        let choice = logical_block(&BlockInputs {
            kernel_sizes: &[Exact(128)],
            user_block: None,
            default_block: 16,
            is_mla: true,
            attention_bytes_per_token: 1152,
            mamba_state_bytes: None,
        });
        assert_eq!(
            choice,
            BlockChoice {
                preferred: 128,
                logical: 128
            }
        );
    }

    #[test]
    fn the_default_block_is_the_releases() {
        // FlashInfer accepts 16 and 64: the release's default stands, and a
        // hybrid aligns from it (Qwen3-Next TP2: 544 tokens from 16, 576 from 64).
        let fi = [Exact(16), Exact(32), Exact(64)];
        let choice = |default_block, mamba| {
            logical_block(&BlockInputs {
                kernel_sizes: &fi,
                user_block: None,
                default_block,
                is_mla: false,
                attention_bytes_per_token: 1024,
                mamba_state_bytes: mamba,
            })
        };
        assert_eq!(choice(16, None).logical, 16);
        assert_eq!(choice(64, None).logical, 64);
        assert_eq!(choice(16, Some(548_864)).logical, 544);
        assert_eq!(choice(64, Some(548_864)).logical, 576);
        // A backend without 64 falls back to its smallest size.
        let exact128 = logical_block(&BlockInputs {
            kernel_sizes: &[Exact(128)],
            user_block: None,
            default_block: 64,
            is_mla: true,
            attention_bytes_per_token: 1152,
            mamba_state_bytes: None,
        });
        assert_eq!(exact128.preferred, 128);
    }
}
