//! Per-request block-id transformations shared by pull and push: logical to
//! kernel expansion, the block-size-ratio mapping (attention expanded to
//! remote granularity and clipped, mamba 1:1) and the prefix-cache alignment.

use super::policy::PrefixCountTolerance;
use crate::geometry::GroupKind;

/// Block ids per KV-cache group.
pub type BlockIds = Vec<Vec<u32>>;

/// A planning step refused the request (vLLM raises an assertion here).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AlignError {
    #[error("group {group}: decode has {decode} blocks but prefill only {prefill}")]
    DecodeLonger {
        group: usize,
        decode: usize,
        prefill: usize,
    },
    #[error("group {group}: unpairable SSM state slots, decode={decode} prefill={prefill}")]
    UnpairableState {
        group: usize,
        decode: usize,
        prefill: usize,
    },
    #[error("group {group}: |{decode} - {prefill}| exceeds the padding bound {bound}")]
    CountMismatch {
        group: usize,
        decode: usize,
        prefill: usize,
        bound: usize,
    },
}

/// Expand logical ids of attention groups to kernel ids (`b * ppl + j`);
/// mamba groups stay logical.
pub fn logical_to_kernel(block_ids: &[Vec<u32>], groups: &[GroupKind], ppl: u32) -> BlockIds {
    block_ids
        .iter()
        .zip(groups)
        .map(|(ids, kind)| match kind {
            GroupKind::Mamba => ids.clone(),
            GroupKind::Attention => ids
                .iter()
                .flat_map(|&b| (0..ppl).map(move |j| b * ppl + j))
                .collect(),
        })
        .collect()
}

/// Map local attention ids to remote granularity: each local kernel block
/// becomes `ratio` sub-blocks, clipped to the remote list's length. Mamba
/// groups pass through. An all-empty local result means a full prefix hit
/// and is returned as an empty list of groups.
pub fn map_for_block_size_ratio(
    local: &[Vec<u32>],
    remote: &[Vec<u32>],
    groups: &[GroupKind],
    ratio: u32,
) -> (BlockIds, BlockIds) {
    let mut mapped_local = Vec::new();
    for (i, remote_group) in remote.iter().enumerate() {
        let local_group = local.get(i).cloned().unwrap_or_default();
        if groups[i] == GroupKind::Mamba {
            mapped_local.push(local_group);
            continue;
        }
        let mut mapped: Vec<u32> = local_group
            .iter()
            .flat_map(|&b| (0..ratio).map(move |q| b * ratio + q))
            .collect();
        mapped.truncate(remote_group.len());
        mapped_local.push(mapped);
    }
    if mapped_local.iter().all(Vec::is_empty) {
        return (Vec::new(), remote.to_vec());
    }
    (mapped_local, remote.to_vec())
}

/// Trim decode (D) and prefill (P) kernel-level lists so that only what must
/// move is paired, as vLLM 0.33.0's `_apply_prefix_caching` does.
pub fn apply_prefix_caching(
    decode: &[Vec<u32>],
    prefill: &[Vec<u32>],
    groups: &[GroupKind],
    decode_ppl: u32,
    prefill_ppl: u32,
    tolerance: PrefixCountTolerance,
) -> Result<(BlockIds, BlockIds), AlignError> {
    let mut decode = decode.to_vec();
    let mut prefill = prefill.to_vec();
    let has_mamba = groups.contains(&GroupKind::Mamba);
    for (g, kind) in groups.iter().enumerate() {
        let (nd, np) = (decode[g].len(), prefill[g].len());
        if !has_mamba {
            if nd > np {
                return Err(AlignError::DecodeLonger {
                    group: g,
                    decode: nd,
                    prefill: np,
                });
            }
            prefill[g] = last(&prefill[g], nd);
            continue;
        }
        match kind {
            GroupKind::Mamba => pair_state_slots(&mut decode[g], &mut prefill[g], g)?,
            GroupKind::Attention if decode_ppl == prefill_ppl && nd < np => {
                prefill[g] = last(&prefill[g], nd);
            }
            GroupKind::Attention => {
                check_padding(g, nd, np, decode_ppl, prefill_ppl, tolerance)?;
                let n = nd.min(np);
                decode[g].truncate(n);
                prefill[g].truncate(n);
            }
        }
    }
    Ok((decode, prefill))
}

/// State slots pair by position: equal counts pair 1:1; a longer prefill
/// list holds positions decode already has (keep its tail); a longer decode
/// list (by one) holds the slot decode recomputes itself (keep its head).
fn pair_state_slots(
    decode: &mut Vec<u32>,
    prefill: &mut Vec<u32>,
    group: usize,
) -> Result<(), AlignError> {
    let (nd, np) = (decode.len(), prefill.len());
    if nd == np {
        return Ok(());
    }
    if nd > np + 1 {
        return Err(AlignError::UnpairableState {
            group,
            decode: nd,
            prefill: np,
        });
    }
    let n = nd.min(np);
    if nd < np {
        *prefill = last(prefill, n);
    } else {
        decode.truncate(n);
    }
    Ok(())
}

/// Allocation rounding leaves up to ppl - 1 dead kernel blocks per side plus
/// the block of the recomputed last token: counts may differ by up to the
/// sum of both ppl (vLLM 0.33.0's bound; `StrictMaxPpl` is the older
/// strict `max`).
fn check_padding(
    group: usize,
    nd: usize,
    np: usize,
    decode_ppl: u32,
    prefill_ppl: u32,
    tolerance: PrefixCountTolerance,
) -> Result<(), AlignError> {
    let diff = nd.abs_diff(np);
    let (bound, ok) = if tolerance == PrefixCountTolerance::StrictMaxPpl {
        let bound = decode_ppl.max(prefill_ppl) as usize;
        (bound, diff < bound)
    } else {
        let bound = (decode_ppl + prefill_ppl) as usize;
        (bound, diff <= bound)
    };
    if ok {
        Ok(())
    } else {
        Err(AlignError::CountMismatch {
            group,
            decode: nd,
            prefill: np,
            bound,
        })
    }
}

/// kvgeom's alignment of decode's and prefill's lists: both start at the
/// first token the transfer moves. Per attention group, the `skip[g]`
/// entries of prefill's list holding tokens decode already has (its prefix
/// hit) are dropped, then both lists keep their common length from the
/// front; state slots pair as in vLLM. vLLM 0.33.0's `apply_prefix_caching`
/// end-aligns prefill's list instead (`PrefixAlignment::EndTrim`),
/// which pairs the wrong tokens whenever prefill's list does not end where
/// decode's does.
pub fn align_from_first_token(
    decode: &[Vec<u32>],
    prefill: &[Vec<u32>],
    groups: &[GroupKind],
    skip: &[usize],
    decode_ppl: u32,
    prefill_ppl: u32,
    tolerance: PrefixCountTolerance,
) -> Result<(BlockIds, BlockIds), AlignError> {
    let mut decode = decode.to_vec();
    let mut prefill = prefill.to_vec();
    for (g, kind) in groups.iter().enumerate() {
        match kind {
            GroupKind::Mamba => pair_state_slots(&mut decode[g], &mut prefill[g], g)?,
            GroupKind::Attention => {
                let cut = skip.get(g).copied().unwrap_or(0).min(prefill[g].len());
                prefill[g].drain(..cut);
                let (nd, np) = (decode[g].len(), prefill[g].len());
                check_padding(g, nd, np, decode_ppl, prefill_ppl, tolerance)?;
                let n = nd.min(np);
                decode[g].truncate(n);
                prefill[g].truncate(n);
            }
        }
    }
    Ok((decode, prefill))
}

/// Both lists paired from the transfer's last token, and per group the
/// range of the initiator's sub-blocks the pairs cover.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LastTokenPairing {
    /// The initiator's (decode's) ids per group: attention in units of the
    /// peer's kernel block, mamba unchanged.
    pub local: BlockIds,
    /// The peer's (prefill's) kernel ids per group, mamba unchanged.
    pub remote: BlockIds,
    /// Per group, `start..end` of the initiator's sub-blocks the pairs
    /// cover (positions in its sub-block list before any trimming).
    pub covered: Vec<std::ops::Range<u64>>,
}

/// vLLM 0.34.0's pairing for a pull across different kernel or logical
/// block sizes (`PrefixAlignment::LastTokenWhenSizesDiffer`). Per attention
/// group: decode's kernel blocks become `ratio` sub-blocks each; both
/// sides allocate whole logical blocks up to prefill's last token, so the
/// sub-blocks past `sub_blocks` (prefill's token count in peer-kernel
/// units) in each side's last logical block are dropped (`-sub_blocks mod
/// per_logical`) and the lists are paired from their ends. Mamba groups
/// pass through unpaired. Right only when decode's list ends in the
/// logical block of prefill's last token: a decode list that goes one
/// logical block further pairs prefill's tokens with later decode tokens.
pub fn pair_from_last_token(
    local_kernel: &[Vec<u32>],
    remote_kernel: &[Vec<u32>],
    groups: &[GroupKind],
    ratio: u32,
    local_ppl: u32,
    remote_ppl: u32,
    sub_blocks: u64,
) -> LastTokenPairing {
    let local_per_logical = u64::from(local_ppl * ratio);
    let remote_per_logical = u64::from(remote_ppl);
    let mut out = LastTokenPairing {
        local: Vec::new(),
        remote: Vec::new(),
        covered: Vec::new(),
    };
    for (g, kind) in groups.iter().enumerate() {
        let local = local_kernel.get(g).cloned().unwrap_or_default();
        let remote = remote_kernel.get(g).cloned().unwrap_or_default();
        if *kind == GroupKind::Mamba {
            out.covered.push(0..local.len() as u64);
            out.local.push(local);
            out.remote.push(remote);
            continue;
        }
        let mut local: Vec<u32> = local
            .iter()
            .flat_map(|&b| (0..ratio).map(move |q| b * ratio + q))
            .collect();
        let mut remote = remote;
        let padding =
            |per_logical: u64| ((per_logical - sub_blocks % per_logical) % per_logical) as usize;
        local.truncate(local.len().saturating_sub(padding(local_per_logical)));
        remote.truncate(remote.len().saturating_sub(padding(remote_per_logical)));
        let n = local.len().min(remote.len());
        out.covered
            .push((local.len() - n) as u64..local.len() as u64);
        out.local.push(local[local.len() - n..].to_vec());
        out.remote.push(remote[remote.len() - n..].to_vec());
    }
    out
}

/// The last `n` entries. Python's `x[-0:]` would return the whole list;
/// vLLM 0.33.0 has that edge, which only arises for an attention group with
/// no decode blocks next to a non-empty one, and the length check after it
/// refuses the transfer either way.
fn last(ids: &[u32], n: usize) -> Vec<u32> {
    if n == 0 {
        return ids.to_vec();
    }
    ids[ids.len() - n..].to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;
    use GroupKind::{Attention as A, Mamba as M};

    #[test]
    fn last_token_pairing_drops_padding_and_pairs_from_the_ends() {
        // G1 at prompt 13 (12 tokens move): D 12/4 (ppl 3), P 8/4 (ppl 2).
        // Mainline: D holds one logical block, P two; P's fourth kernel
        // block is padding past token 11.
        let p = pair_from_last_token(
            &[vec![0, 1, 2], vec![5]],
            &[vec![10, 11, 12, 13], vec![7]],
            &[A, M],
            1,
            3,
            2,
            3,
        );
        assert_eq!(p.local, vec![vec![0, 1, 2], vec![5]]);
        assert_eq!(p.remote, vec![vec![10, 11, 12], vec![7]]);
        assert_eq!(p.covered, vec![0..3, 0..1]);
        // With the last-token block D holds a second logical block: its
        // tail pairs with P's tokens 0..12 and the head is left uncovered.
        let p = pair_from_last_token(
            &[(0..6).collect()],
            &[vec![10, 11, 12, 13]],
            &[A],
            1,
            3,
            2,
            3,
        );
        assert_eq!(p.local, vec![vec![3, 4, 5]]);
        assert_eq!(p.remote, vec![vec![10, 11, 12]]);
        assert_eq!(p.covered, vec![3..6]);
        // A kernel ratio splits D's blocks into P-sized sub-blocks first:
        // D 8/8 holds tokens 0..16 in two blocks, P 4/4 holds 10 tokens in
        // three; D's fourth sub-block is past token 9.
        let p = pair_from_last_token(&[vec![4, 5]], &[vec![20, 21, 22]], &[A], 2, 1, 1, 3);
        assert_eq!(p.local, vec![vec![8, 9, 10]]);
        assert_eq!(p.remote, vec![vec![20, 21, 22]]);
        assert_eq!(p.covered, vec![0..3]);
        // After a prefix hit D's list starts later: the ends still pair.
        let p = pair_from_last_token(&[vec![5]], &[vec![20, 21, 22]], &[A], 2, 1, 1, 3);
        assert_eq!(p.local, vec![vec![10]]);
        assert_eq!(p.remote, vec![vec![22]]);
        assert_eq!(p.covered, vec![0..1]);
    }

    #[test]
    fn expands_attention_only() {
        let k = logical_to_kernel(&[vec![1, 3], vec![0]], &[A, M], 3);
        assert_eq!(k, vec![vec![3, 4, 5, 9, 10, 11], vec![0]]);
    }

    #[test]
    fn ratio_mapping_clips_to_remote() {
        let remote = vec![(30..40).collect::<Vec<_>>(), vec![42]];
        let (l, r) = map_for_block_size_ratio(&[vec![1, 2, 3], vec![7]], &remote, &[A, M], 4);
        assert_eq!(l, vec![(4..14).collect::<Vec<_>>(), vec![7]]);
        assert_eq!(r, remote);
        let (l, _) = map_for_block_size_ratio(&[vec![]], &[vec![1, 2]], &[A], 4);
        assert!(l.is_empty());
    }

    #[test]
    fn hetero_ppl_front_trims_both_sides() {
        // Local ppl 6 with 12 kernel blocks vs remote ppl 10 with 10: both keep 0..9.
        let d = vec![(0..12).collect::<Vec<_>>(), vec![3]];
        let p = vec![(0..10).collect::<Vec<_>>(), vec![5]];
        let (d2, p2) =
            apply_prefix_caching(&d, &p, &[A, M], 6, 10, PrefixCountTolerance::default()).unwrap();
        assert_eq!(d2[0], (0..10).collect::<Vec<_>>());
        assert_eq!(p2[0], (0..10).collect::<Vec<_>>());
        let (d3, p3) =
            apply_prefix_caching(&p, &d, &[A, M], 10, 6, PrefixCountTolerance::default()).unwrap();
        assert_eq!((d3[0].len(), p3[0].len()), (10, 10));
    }

    #[test]
    fn a_prefix_hit_skips_cached_prefill_entries_and_clips_decode() {
        // D: hit block (tokens 0..16) cached, transfer blocks hold tokens 16..32 and
        // the recomputed token 32; P holds tokens 0..32. 4 kernel blocks per block.
        let d = vec![(28..36).collect::<Vec<_>>(), vec![2]];
        let p = vec![(8..16).collect::<Vec<_>>(), vec![4]];
        let (d, p) = align_from_first_token(
            &d,
            &p,
            &[A, M],
            &[4, 0],
            4,
            4,
            PrefixCountTolerance::default(),
        )
        .unwrap();
        assert_eq!(p, vec![vec![12, 13, 14, 15], vec![4]]);
        assert_eq!(d, vec![vec![28, 29, 30, 31], vec![2]]);
        // vLLM 0.33.0 front-trims equal counts: D's tokens 16.. would receive P's tokens 0..
        let (d2, p2) = apply_prefix_caching(
            &[(28..36).collect(), vec![2]],
            &[(8..16).collect(), vec![4]],
            &[A, M],
            4,
            4,
            PrefixCountTolerance::default(),
        )
        .unwrap();
        assert_eq!((d2[0][0], p2[0][0]), (28, 8));
    }

    #[test]
    fn different_logical_blocks_without_mamba_align_from_the_first_token() {
        // P logical 12 / D logical 4 on 4-token kernels, 8 tokens: P holds 3 kernel
        // blocks (one dead), D 2. vLLM end-trims P to its last two (tokens 4..12).
        let (d, p) = align_from_first_token(
            &[vec![5, 9]],
            &[vec![30, 31, 32]],
            &[A],
            &[0],
            1,
            3,
            PrefixCountTolerance::default(),
        )
        .unwrap();
        assert_eq!((d[0].clone(), p[0].clone()), (vec![5, 9], vec![30, 31]));
        let (_, p) = apply_prefix_caching(
            &[vec![5, 9]],
            &[vec![30, 31, 32]],
            &[A],
            1,
            3,
            PrefixCountTolerance::default(),
        )
        .unwrap();
        assert_eq!(p[0], vec![31, 32]);
        // D logical 16 / P logical 4: D holds more kernel blocks than P filled.
        let (d, p) = align_from_first_token(
            &[vec![0, 1, 2, 3]],
            &[vec![7, 8]],
            &[A],
            &[0],
            4,
            1,
            PrefixCountTolerance::default(),
        )
        .unwrap();
        assert_eq!((d[0].clone(), p[0].clone()), (vec![0, 1], vec![7, 8]));
        assert!(apply_prefix_caching(
            &[vec![0, 1, 2, 3]],
            &[vec![7, 8]],
            &[A],
            4,
            1,
            PrefixCountTolerance::default()
        )
        .is_err());
    }

    #[test]
    fn equal_ppl_prefix_hit_end_trims_prefill() {
        let (d, p) = apply_prefix_caching(
            &[vec![7, 8]],
            &[vec![1, 2, 3, 4]],
            &[A],
            1,
            1,
            PrefixCountTolerance::default(),
        )
        .unwrap();
        assert_eq!((d[0].clone(), p[0].clone()), (vec![7, 8], vec![3, 4]));
        assert!(apply_prefix_caching(
            &[vec![1, 2, 3]],
            &[vec![1]],
            &[A],
            1,
            1,
            PrefixCountTolerance::default()
        )
        .is_err());
    }

    #[test]
    fn tolerance_is_inclusive_sum_and_strict_max_refuses_n25() {
        // 12-token local vs 8-token remote blocks (kernel 4), N = 25, PR allocation model.
        let d = vec![vec![6, 7, 8, 15, 16, 17, 18, 19, 20], vec![0]];
        let p = vec![vec![8, 9, 14, 15, 18, 19], vec![1]];
        let (d2, p2) =
            apply_prefix_caching(&d, &p, &[A, M], 3, 2, PrefixCountTolerance::default()).unwrap();
        assert_eq!(d2[0], vec![6, 7, 8, 15, 16, 17]);
        assert_eq!(p2[0], vec![8, 9, 14, 15, 18, 19]);
        let err = apply_prefix_caching(&d, &p, &[A, M], 3, 2, PrefixCountTolerance::StrictMaxPpl);
        assert!(matches!(
            err,
            Err(AlignError::CountMismatch { bound: 3, .. })
        ));
    }
}
