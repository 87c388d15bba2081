//! Local descriptor lists: attention pages at a given sub-block granularity
//! followed by the mamba state sub-regions, which always keep the local page
//! geometry (vLLM's `_build_fa_local` + `_build_mamba_local`).

use super::policy::{MambaExpansion, Policy, SubBlockAddressing};
use super::registration::Registration;
use crate::nixl::{DescList, StridedRun};

/// Attention descriptors of every region, each kernel block split into
/// `ratio` sub-blocks of `block_len / ratio` bytes.
pub fn attention_runs(reg: &Registration, ratio: u32, policy: Policy) -> Vec<StridedRun> {
    let ratio = u64::from(ratio);
    let mut runs = Vec::new();
    for region in &reg.regions {
        let sub_len = region.block_len / ratio;
        let evenly_spaced = ratio == 1 || region.block_stride == ratio * sub_len;
        if evenly_spaced || policy.sub_block_addressing == SubBlockAddressing::StrideOverRatio {
            runs.push(StridedRun {
                addr: region.base,
                len: sub_len,
                dev: reg.device,
                stride: region.block_stride / ratio,
                count: region.num_blocks * ratio,
            });
        } else {
            // Sub-blocks abut only inside a padded block: one run per block.
            runs.extend((0..region.num_blocks).map(|b| StridedRun {
                addr: region.base + b * region.block_stride,
                len: sub_len,
                dev: reg.device,
                stride: sub_len,
                count: ratio,
            }));
        }
    }
    runs
}

/// Mamba descriptors: per SSM region, each conv sub-projection then the SSM
/// state, one descriptor per logical block. Never ratio-expanded.
pub fn mamba_runs(reg: &Registration, ratio: u32, policy: Policy) -> Vec<StridedRun> {
    let ppl = u64::from(reg.ppl);
    let expand = policy.mamba_expansion == MambaExpansion::RatioExpanded && ratio > 1;
    let mut runs = Vec::new();
    for &i in &reg.ssm_regions {
        let region = &reg.regions[i];
        let (stride, count) = if expand {
            // The pre-fix geometry: a page stride of block_len / ratio x ppl
            // and ratio times as many state blocks.
            (
                region.block_len / u64::from(ratio) * ppl,
                reg.num_logical_blocks * u64::from(ratio),
            )
        } else {
            (region.block_stride * ppl, reg.num_logical_blocks)
        };
        for sub in &reg.conv_offsets {
            runs.push(StridedRun {
                addr: region.base + sub.offset,
                len: sub.size,
                dev: reg.device,
                stride,
                count,
            });
        }
        runs.push(StridedRun {
            addr: region.base + reg.ssm_sizes.0,
            len: reg.ssm_sizes.1,
            dev: reg.device,
            stride,
            count,
        });
    }
    runs
}

/// The full local list at sub-block granularity `ratio` (1 = own kernel size).
pub fn local_list(reg: &Registration, ratio: u32, policy: Policy) -> DescList {
    let mut runs = attention_runs(reg, ratio, policy);
    if reg.has_mamba() {
        runs.extend(mamba_runs(reg, ratio, policy));
    }
    DescList::from_runs(runs)
}
