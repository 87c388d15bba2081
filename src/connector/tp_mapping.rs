//! Which remote TP ranks a local rank reads each KV-cache group from, and
//! where each source lands (vLLM's `compute_tp_mapping`, without DCP).

use crate::geometry::{GroupKind, ModelSpec};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TpMapping {
    /// Source ranks per group, in group order.
    pub source_ranks_per_group: Vec<Vec<u32>>,
    /// Sorted union of all source ranks: one read (or write) per entry.
    pub all_source_ranks: Vec<u32>,
    /// Head slot of each source rank inside the local attention block.
    pub rank_to_attention_slot: Vec<(u32, u32)>,
    /// Head-slice index this rank reads inside a bigger remote block.
    pub rank_offset_factor: u64,
    /// Local ranks reading each source rank (sent in the completion notification).
    pub local_consumers: u32,
}

impl TpMapping {
    pub fn attention_slot(&self, rank: u32) -> u32 {
        self.rank_to_attention_slot
            .iter()
            .find(|(r, _)| *r == rank)
            .map_or(0, |(_, s)| *s)
    }
}

/// The prefill ranks decode rank `decode_rank` of `decode_tp` reads a
/// request's KV from, against a prefill engine of `prefill_tp` ranks (pull
/// mode): every rank one of its READs addresses. Ranks outside the prefill
/// engine are dropped (a pair whose TP sizes do not divide is refused at
/// the handshake).
pub fn pull_source_ranks(
    model: &ModelSpec,
    decode_rank: u32,
    decode_tp: u32,
    prefill_tp: u32,
) -> Vec<u32> {
    let mut ranks = model_tp_mapping(model, decode_rank, decode_tp, prefill_tp).all_source_ranks;
    ranks.retain(|&r| r < prefill_tp);
    ranks
}

/// [`compute_tp_mapping`] with the MLA flag, KV heads and groups taken from `model`.
pub(crate) fn model_tp_mapping(
    model: &ModelSpec,
    tp_rank: u32,
    tp_size: u32,
    remote_tp: u32,
) -> TpMapping {
    compute_tp_mapping(
        tp_rank,
        tp_size,
        remote_tp,
        model.is_mla(),
        model.attention.as_ref().map_or(1, |a| a.total_kv_heads()),
        &model.groups,
    )
}

fn head_offset(tp_rank: u32, tp_size: u32, remote_tp: u32, total_heads: u32) -> u64 {
    if tp_size <= remote_tp {
        return 0;
    }
    if tp_size > total_heads {
        let remote_rank = tp_rank * remote_tp / tp_size;
        let local_head = tp_rank * total_heads / tp_size;
        let remote_head = remote_rank * total_heads / remote_tp;
        return u64::from(local_head - remote_head);
    }
    u64::from(tp_rank % (tp_size / remote_tp))
}

/// Compute the mapping of local rank `tp_rank` of `tp_size` against a remote
/// engine of `remote_tp` ranks. `total_heads` is 1 for MLA.
pub fn compute_tp_mapping(
    tp_rank: u32,
    tp_size: u32,
    remote_tp: u32,
    is_mla: bool,
    total_heads: u32,
    groups: &[GroupKind],
) -> TpMapping {
    let attn_ranks: Vec<u32> = if is_mla || tp_size >= remote_tp {
        vec![tp_rank * remote_tp / tp_size]
    } else {
        let per_local = remote_tp / tp_size;
        let start = tp_rank * per_local;
        let mut seen_heads = Vec::new();
        let mut ranks = Vec::new();
        for rank in start..start + per_local {
            let head = rank * total_heads / remote_tp;
            if !seen_heads.contains(&head) {
                seen_heads.push(head);
                ranks.push(rank);
            }
        }
        ranks
    };
    let ssm_ranks: Vec<u32> = if !groups.contains(&GroupKind::Mamba) {
        Vec::new()
    } else if tp_size < remote_tp {
        let per_local = remote_tp / tp_size;
        (tp_rank * per_local..(tp_rank + 1) * per_local).collect()
    } else {
        attn_ranks.clone()
    };
    let mut all: Vec<u32> = attn_ranks.iter().chain(&ssm_ranks).copied().collect();
    all.sort_unstable();
    all.dedup();
    let source_ranks_per_group = groups
        .iter()
        .map(|g| match g {
            GroupKind::Mamba => ssm_ranks.clone(),
            GroupKind::Attention => attn_ranks.clone(),
        })
        .collect();
    let head_of = |r: u32| r * total_heads / remote_tp;
    let rank_to_attention_slot = all
        .iter()
        .map(|&r| {
            let slot = attn_ranks
                .iter()
                .position(|&a| head_of(a) == head_of(r))
                .unwrap_or(0);
            (r, slot as u32)
        })
        .collect();
    let rank_offset_factor = if is_mla {
        0
    } else {
        head_offset(tp_rank, tp_size, remote_tp, total_heads)
    };
    let local_consumers = if tp_size >= remote_tp {
        (tp_size / remote_tp).max(1)
    } else {
        1
    };
    TpMapping {
        source_ranks_per_group,
        all_source_ranks: all,
        rank_to_attention_slot,
        rank_offset_factor,
        local_consumers,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kimi_linear_tp8_to_tp1() {
        let groups = [GroupKind::Attention, GroupKind::Mamba, GroupKind::Mamba];
        let m = compute_tp_mapping(0, 1, 8, true, 1, &groups);
        assert_eq!(m.source_ranks_per_group[0], vec![0]);
        assert_eq!(m.source_ranks_per_group[1], (0..8).collect::<Vec<_>>());
        assert_eq!(m.all_source_ranks, (0..8).collect::<Vec<_>>());
        assert!(m.rank_to_attention_slot.iter().all(|(_, s)| *s == 0));
        assert_eq!(m.rank_offset_factor, 0);
        assert_eq!(m.local_consumers, 1);
    }

    #[test]
    fn gqa_two_heads_tp1_from_tp4_dedups_heads() {
        let groups = [GroupKind::Attention, GroupKind::Mamba];
        let m = compute_tp_mapping(0, 1, 4, false, 2, &groups);
        assert_eq!(m.source_ranks_per_group[0], vec![0, 2]);
        assert_eq!(m.source_ranks_per_group[1], vec![0, 1, 2, 3]);
        assert_eq!(
            m.rank_to_attention_slot,
            vec![(0, 0), (1, 0), (2, 1), (3, 1)]
        );
    }

    #[test]
    fn decode_tp_larger_reads_head_slice() {
        let m = compute_tp_mapping(3, 4, 2, false, 8, &[GroupKind::Attention]);
        assert_eq!(m.all_source_ranks, vec![1]);
        assert_eq!(m.rank_offset_factor, 1);
        assert_eq!(m.local_consumers, 2);
    }
}
