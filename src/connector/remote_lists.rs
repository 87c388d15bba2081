//! Remote descriptor lists, built locally from a remote rank's handshake
//! metadata: attention pages (whole for replicated regions, a head slice or
//! a slot share for split ones) followed by the remote mamba sub-regions
//! (vLLM's `_build_fa_remote` + `_build_mamba_remote`).

use super::metadata::HandshakeMetadata;
use super::registration::Registration;
use super::tp_mapping::TpMapping;
use crate::geometry::SubRegion;
use crate::nixl::{DescList, StridedRun};

/// Attention part of a remote rank's list. With `sub_pages > 1` (kvgeom's
/// push into larger decode kernel blocks) every remote page is split into
/// that many sub-pages, each receiving one whole local page.
pub fn attention_runs(
    reg: &Registration,
    mapping: &TpMapping,
    first_attention_group: usize,
    meta: &HandshakeMetadata,
    ratio: u32,
    sub_pages: u32,
) -> Vec<StridedRun> {
    let ratio = u64::from(ratio);
    let sub_pages = u64::from(sub_pages);
    let readers = mapping.source_ranks_per_group[first_attention_group].len() as u64;
    let mut runs = Vec::new();
    for (i, &base) in meta.kv_caches_base_addr.iter().enumerate() {
        let local_len = reg.regions[i].block_len;
        let unit = local_len / ratio;
        let (reads, offset) = if reg.regions[i].replicated {
            (1, 0)
        } else {
            (readers, mapping.rank_offset_factor * unit)
        };
        let len = unit / reads;
        let (stride, page) = (meta.block_strides[i], meta.block_lens[i]);
        if sub_pages == 1 || stride == page {
            runs.push(StridedRun {
                addr: base + offset,
                len,
                dev: meta.device_id,
                stride: stride / sub_pages,
                count: meta.num_blocks * sub_pages,
            });
        } else {
            runs.extend((0..meta.num_blocks).map(|b| StridedRun {
                addr: base + b * stride + offset,
                len,
                dev: meta.device_id,
                stride: page / sub_pages,
                count: sub_pages,
            }));
        }
    }
    runs
}

/// Mamba part of a remote rank's list; `conv` are the conv sub-projection
/// pieces of the remote page (`conv_split.rs`).
pub fn mamba_runs(
    reg: &Registration,
    tp_rank: u32,
    meta: &HandshakeMetadata,
    tp_ratio: i32,
    conv: &[SubRegion],
) -> Vec<StridedRun> {
    let slice = u64::from(tp_rank % tp_ratio.max(1) as u32);
    let ssm_read = if tp_ratio >= 1 {
        reg.ssm_sizes.1
    } else {
        meta.ssm_sizes.1
    };
    let remote_ppl = u64::from(meta.physical_blocks_per_logical_kv_block);
    let logical_blocks = meta.num_blocks / remote_ppl;
    let mut runs = Vec::new();
    for &i in &reg.ssm_regions {
        let base = meta.kv_caches_base_addr[i];
        let stride = meta.block_strides[i] * remote_ppl;
        for sub in conv {
            runs.push(StridedRun {
                addr: base + sub.offset,
                len: sub.size,
                dev: meta.device_id,
                stride,
                count: logical_blocks,
            });
        }
        runs.push(StridedRun {
            addr: base + meta.ssm_sizes.0 + slice * ssm_read,
            len: ssm_read,
            dev: meta.device_id,
            stride,
            count: logical_blocks,
        });
    }
    runs
}

/// The full list of one remote rank.
#[allow(clippy::too_many_arguments)]
pub fn remote_list(
    reg: &Registration,
    mapping: &TpMapping,
    first_attention_group: usize,
    tp_rank: u32,
    meta: &HandshakeMetadata,
    ratio: u32,
    sub_pages: u32,
    tp_ratio: i32,
    conv: &[SubRegion],
) -> DescList {
    let mut runs = attention_runs(reg, mapping, first_attention_group, meta, ratio, sub_pages);
    if reg.has_mamba() {
        runs.extend(mamba_runs(reg, tp_rank, meta, tp_ratio, conv));
    }
    DescList::from_runs(runs)
}
