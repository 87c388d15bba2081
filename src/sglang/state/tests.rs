//! The state oracles on simulated transfers: a channel-correct one passes,
//! a conv state sliced as one contiguous block (SGLang's path when a
//! config names no conv sub-blocks) fails them.

use super::*;
use crate::geometry::sglang_state::{SglangState, StateKind};

fn mamba2() -> SglangState {
    SglangState {
        kind: StateKind::Mamba2,
        layers: vec![0, 2],
        conv_kernel: 4,
        n_groups: Some(2),
        ssm_state_size: Some(4),
        num_heads: Some(8),
        head_dim: Some(4),
        num_k_heads: None,
        head_k_dim: None,
        num_v_heads: None,
        head_v_dim: None,
    }
}

fn gdn() -> SglangState {
    SglangState {
        kind: StateKind::Gdn,
        layers: vec![1],
        conv_kernel: 4,
        n_groups: None,
        ssm_state_size: None,
        num_heads: None,
        head_dim: None,
        num_k_heads: Some(2),
        head_k_dim: Some(4),
        num_v_heads: Some(4),
        head_v_dim: Some(4),
    }
}

/// Simulate the transfer: per decode rank and tensor, per channel, copy
/// from the prefill rank holding it (`by_channel`), or the contiguous
/// channel range of a one-block slice (`!by_channel`, conv only).
fn simulate(st: &SglangState, p_tp: u32, d_tp: u32, by_channel: bool) -> Vec<Violation> {
    let ps = StatePools::new(Side::Prefill, st, p_tp, 2);
    let ds = StatePools::new(Side::Decode, st, d_tp, 1);
    let before: StateImages = (0..p_tp)
        .map(|r| ps.tensors(r).iter().map(prefill_image).collect())
        .collect();
    let mut after: StateImages = (0..d_tp)
        .map(|r| {
            ds.tensors(r)
                .iter()
                .map(|t| vec![SENTINEL; t.len() as usize])
                .collect()
        })
        .collect();
    let mut writes = Vec::new();
    for dr in 0..d_tp {
        for dt in ds.tensors(dr) {
            for (c, ch) in dt.channels.iter().enumerate() {
                // The source channel: the same model channel, or the c-th
                // of the concatenated prefill rows (one-block slicing).
                let (sr, pc) = if by_channel || dt.field == Field::Temporal {
                    let sr = (0..p_tp)
                        .find(|&r| ps.tensors(r)[dt.index as usize].channels.contains(ch))
                        .unwrap();
                    let pc = ps.tensors(sr)[dt.index as usize]
                        .channels
                        .iter()
                        .position(|x| x == ch)
                        .unwrap();
                    (sr, pc)
                } else {
                    let global = dr * dt.dim + c as u32;
                    let pdim = ps.tensors(0)[dt.index as usize].dim;
                    (global / pdim, (global % pdim) as usize)
                };
                let pt = &ps.tensors(sr)[dt.index as usize];
                for o in 0..dt.outer as u64 {
                    let src = u64::from(ps.slot) * pt.item_len()
                        + o * u64::from(pt.dim) * pt.inner
                        + pc as u64 * pt.inner;
                    let dst = u64::from(ds.slot) * dt.item_len()
                        + o * u64::from(dt.dim) * dt.inner
                        + c as u64 * dt.inner;
                    let img = &before[sr as usize][dt.index as usize];
                    after[dr as usize][dt.index as usize][dst as usize..(dst + dt.inner) as usize]
                        .copy_from_slice(&img[src as usize..(src + pt.inner) as usize]);
                    writes.push(StateWrite {
                        source: (sr, dt.index, src),
                        destination: (dr, dt.index, dst),
                        len: dt.inner,
                    });
                }
            }
        }
    }
    judge_state(
        &StateObserved {
            prefill: &ps,
            decode: &ds,
            prefill_before: &before,
            prefill_after: &before,
            decode_after: &after,
            writes: &writes,
        },
        0,
    )
}

fn oracles(v: &[Violation]) -> std::collections::BTreeSet<&'static str> {
    v.iter().map(|v| v.oracle).collect()
}

#[test]
fn channel_correct_state_passes_both_ways() {
    for st in [mamba2(), gdn()] {
        for (p, d) in [(1, 1), (1, 2), (2, 1), (2, 4), (4, 2)] {
            let v = simulate(&st, p, d, true);
            assert!(v.is_empty(), "{:?} p{p} d{d}: {v:?}", st.kind);
        }
    }
}

#[test]
fn conv_sliced_as_one_block_violates_pairing_and_final_bytes() {
    for st in [mamba2(), gdn()] {
        for (p, d) in [(1, 2), (2, 1)] {
            let v = simulate(&st, p, d, false);
            let o = oracles(&v);
            assert!(
                o.contains("pairing") && o.contains("transferred_or_zeroed"),
                "{o:?}"
            );
            // Only conv tensors (index < layers) are wrong.
            assert!(v
                .iter()
                .all(|x| x.region.is_some_and(|r| r < st.layers.len() as u32)));
        }
    }
    // Equal TP: one block is the whole row, and right.
    assert!(simulate(&mamba2(), 2, 2, false).is_empty());
}

#[test]
fn mamba2_groups_replicate_when_tp_exceeds_them() {
    let ps = StatePools::new(Side::Prefill, &mamba2(), 4, 0);
    // 2 groups over 4 ranks: ranks 0,1 hold group 0; 2,3 group 1.
    let b = |r: u32| {
        ps.conv_channels(r)
            .into_iter()
            .filter(|c| c.0 == 2)
            .collect::<Vec<_>>()
    };
    assert_eq!(b(0), b(1));
    assert_eq!(b(2)[0], (2, 4));
    assert_eq!(ps.tensors(0)[0].dim, 8 + 4 + 4);
}

#[test]
fn kda_conv_is_window_major() {
    let st = SglangState {
        kind: StateKind::Kda,
        num_heads: Some(4),
        head_dim: Some(4),
        ..gdn()
    };
    let st = SglangState {
        num_k_heads: None,
        head_k_dim: None,
        num_v_heads: None,
        head_v_dim: None,
        ..st
    };
    let t = &StatePools::new(Side::Decode, &st, 2, 1).tensors(0)[0];
    assert_eq!((t.outer, t.dim, t.inner), (3, 24, CONV_BYTES));
    assert!(simulate(&st, 2, 1, true).is_empty());
    assert!(!simulate(&st, 1, 2, false).is_empty());
}

/// The driver result of one prefill rank whose state regions are kvgeom's
/// model, the conv ones reporting `conv_groups`.
fn reported(pools: &StatePools, conv_groups: Option<Vec<u32>>) -> DriverResult {
    let state_regions = pools
        .tensors(0)
        .iter()
        .map(|t| crate::sglang::result::StateRegion {
            index: t.index,
            what: t.what(),
            addr: 0,
            len: t.len(),
            item_len: t.item_len(),
            dim: t.dim,
            outer_count: t.outer,
            conv_shard_groups: if t.field == Field::Conv {
                conv_groups.clone()
            } else {
                None
            },
        })
        .collect();
    let agent = crate::sglang::result::Agent {
        regions: vec![crate::sglang::result::Region::default()],
        state_regions,
        ..Default::default()
    };
    DriverResult {
        agents: [("prefill-0".to_string(), agent)].into_iter().collect(),
        ..Default::default()
    }
}

#[test]
fn layout_check_takes_gdn_conv_groups_named_as_modelled_or_not_at_all() {
    let pools = StatePools::new(Side::Prefill, &gdn(), 1, 2);
    // 0.5.16+: SGLang's config names q | k | v as the model does.
    assert!(matches!(
        check_state_layout(&pools, &reported(&pools, Some(vec![8, 8, 16]))),
        Ok(1)
    ));
    // Before 0.5.16: none named (judged by the oracles, not refused here).
    assert!(matches!(
        check_state_layout(&pools, &reported(&pools, None)),
        Ok(1)
    ));
    // Other groups than the model's are a disagreement.
    assert!(matches!(
        check_state_layout(&pools, &reported(&pools, Some(vec![16, 16]))),
        Err(JudgeError::StateRegion { .. })
    ));
}
