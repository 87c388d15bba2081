//! Descriptor ids: which rows of a prepared list a request's blocks address
//! (vLLM's `_compute_desc_ids`). Attention ids are region-major at kernel (or
//! sub-block) granularity; mamba ids follow all attention ids, sub-region
//! major, at logical granularity and never ratio-expanded.

use super::policy::MambaExpansion;
use crate::geometry::GroupKind;

/// The shape of the list being addressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListShape {
    /// Regions (the local region count is used for both sides).
    pub num_regions: u64,
    /// Kernel blocks per region on the side being addressed.
    pub num_kernel_blocks: u64,
    /// Sub-block ratio of the list (`None` for a remote list).
    pub ratio: Option<u32>,
    /// ppl of the side being addressed.
    pub ppl: u32,
    /// Mamba sub-region lists: SSM regions x (conv projections + 1); 0 without mamba.
    pub num_state_lists: u64,
}

/// Desc ids of `block_ids` (one list per group, attention at kernel or
/// sub-block granularity, mamba at logical granularity).
pub fn compute_desc_ids(
    block_ids: &[Vec<u32>],
    groups: &[GroupKind],
    shape: ListShape,
    state_ids: MambaExpansion,
) -> Vec<u32> {
    let blocks = shape.num_kernel_blocks * u64::from(shape.ratio.unwrap_or(1));
    let num_fa = shape.num_regions * blocks;
    let mut ids = Vec::new();
    if shape.num_state_lists == 0 {
        let all: Vec<u64> = block_ids.iter().flatten().map(|&b| u64::from(b)).collect();
        for region in 0..shape.num_regions {
            ids.extend(all.iter().map(|b| (region * blocks + b) as u32));
        }
        return ids;
    }
    let state_stride = if state_ids == MambaExpansion::RatioExpanded {
        blocks / u64::from(shape.ppl)
    } else {
        shape.num_kernel_blocks / u64::from(shape.ppl)
    };
    for (group, kind) in block_ids.iter().zip(groups) {
        match kind {
            GroupKind::Attention => {
                for region in 0..shape.num_regions {
                    ids.extend(
                        group
                            .iter()
                            .map(|&b| (region * blocks + u64::from(b)) as u32),
                    );
                }
            }
            GroupKind::Mamba => {
                for list in 0..shape.num_state_lists {
                    ids.extend(
                        group
                            .iter()
                            .map(|&b| (num_fa + list * state_stride + u64::from(b)) as u32),
                    );
                }
            }
        }
    }
    ids
}

#[cfg(test)]
mod tests {
    use super::*;
    use GroupKind::{Attention as A, Mamba as M};

    fn shape(blocks: u64, ratio: Option<u32>, ppl: u32) -> ListShape {
        ListShape {
            num_regions: 2,
            num_kernel_blocks: blocks,
            ratio,
            ppl,
            num_state_lists: 8,
        }
    }

    #[test]
    fn hybrid_ratio_one() {
        let ids = compute_desc_ids(
            &[vec![3, 5], vec![1, 2]],
            &[A, M],
            shape(100, None, 1),
            MambaExpansion::OnePerLogicalBlock,
        );
        let mut expected = vec![3, 5, 103, 105];
        for u in 0..8 {
            expected.extend([200 + u * 100 + 1, 200 + u * 100 + 2]);
        }
        assert_eq!(ids, expected);
    }

    #[test]
    fn hybrid_kernel_mismatch_uses_logical_state_stride() {
        let ids = compute_desc_ids(
            &[vec![3, 7], vec![1, 2]],
            &[A, M],
            shape(400, None, 4),
            MambaExpansion::OnePerLogicalBlock,
        );
        assert_eq!(&ids[..4], &[3, 7, 403, 407]);
        assert_eq!(&ids[4..8], &[801, 802, 901, 902]);
    }

    #[test]
    fn hybrid_block_size_ratio_never_expands_state_ids() {
        let ids = compute_desc_ids(
            &[vec![3, 5], vec![1]],
            &[A, M],
            shape(100, Some(4), 1),
            MambaExpansion::OnePerLogicalBlock,
        );
        assert_eq!(&ids[..4], &[3, 5, 403, 405]);
        assert_eq!(&ids[4..8], &[801, 901, 1001, 1101]);
    }
}
