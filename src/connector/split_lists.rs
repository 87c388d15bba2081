//! Per-source split lists for the multi-read path (P_TP > D_TP): one local
//! list per source rank, each placing that rank's share inside the local
//! pages (vLLM's `_build_local_splits_from_plan`).

use super::policy::SplitHeadSlot;
use super::registration::Registration;
use super::tp_mapping::TpMapping;
use crate::geometry::{GroupKind, SubRegion};
use crate::nixl::{DescList, StridedRun};

/// Why split lists cannot be built.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SplitError {
    #[error(
        "Head-sharded attention reads with P_TP > D_TP and heterogeneous block sizes are not supported \
         (block_size_ratio={ratio}, {sources} attention source ranks)"
    )]
    HeadShardedWithRatio { ratio: u32, sources: usize },
}

/// Build one list per entry of `mapping.all_source_ranks` from `src` (the
/// local list at remote granularity); `num_fa` is the attention/state boundary.
/// `conv`, when given, holds per source position the piece of each conv
/// sub-projection in the local page (`conv_split.rs`); otherwise every
/// state sub-region is split evenly over the sources, as vLLM does.
/// `head_slot` says where each source's attention share lands.
#[allow(clippy::too_many_arguments)]
pub fn split_lists(
    reg: &Registration,
    mapping: &TpMapping,
    groups: &[GroupKind],
    src: &DescList,
    num_fa: u64,
    ratio: u32,
    conv: Option<&[Vec<SubRegion>]>,
    head_slot: SplitHeadSlot,
) -> Result<Vec<DescList>, SplitError> {
    let first = |kind| groups.iter().position(|g| *g == kind);
    let fa_splits = first(GroupKind::Attention)
        .map_or(1, |g| mapping.source_ranks_per_group[g].len() as u64)
        .max(1);
    let has_state = num_fa < src.len();
    let ssm_splits = match first(GroupKind::Mamba) {
        Some(g) if has_state => mapping.source_ranks_per_group[g].len() as u64,
        _ => 0,
    };
    // Which region an attention run belongs to, by the id of its first row.
    let per_region = reg.num_kernel_blocks * u64::from(ratio);
    let mut start = 0;
    let runs: Vec<(StridedRun, bool, bool)> = src
        .runs()
        .iter()
        .map(|run| {
            let is_fa = start < num_fa;
            let replicated = is_fa && reg.regions[(start / per_region) as usize].replicated;
            start += run.count;
            (*run, is_fa, replicated)
        })
        .collect();
    let all_replicated = runs.iter().filter(|r| r.1).all(|r| r.2);
    if ratio != 1 && fa_splits != 1 && !all_replicated {
        return Err(SplitError::HeadShardedWithRatio {
            ratio,
            sources: fa_splits as usize,
        });
    }
    Ok(mapping
        .all_source_ranks
        .iter()
        .enumerate()
        .map(|(position, &rank)| {
            let slot = match head_slot {
                SplitHeadSlot::BySourceRank => u64::from(mapping.attention_slot(rank)),
                SplitHeadSlot::First => 0,
            };
            // State runs come per SSM region: each conv sub-projection, then the SSM state.
            let per_region = reg.conv_offsets.len() + 1;
            let mut state_run = 0;
            DescList::from_runs(runs.iter().map(|&(run, is_fa, replicated)| {
                let mut run = run;
                if is_fa && !replicated {
                    run.len /= fa_splits;
                    run.addr += slot * run.len;
                } else if !is_fa && ssm_splits > 0 {
                    let part = state_run % per_region;
                    state_run += 1;
                    match conv.and_then(|c| c.get(position)?.get(part)) {
                        Some(piece) => {
                            run.addr = run.addr - reg.conv_offsets[part].offset + piece.offset;
                            run.len = piece.size;
                        }
                        None => {
                            run.len /= ssm_splits;
                            run.addr += position as u64 * run.len;
                        }
                    }
                }
                run
            }))
        })
        .collect())
}
