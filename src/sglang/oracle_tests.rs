//! Each SGLang oracle on synthetic runs: a correct transfer passes, and a
//! known-defect variant of it fails the oracle that guards against it.

use super::*;
use crate::sglang::images::{decode_region, prefill_region};
use crate::sglang::layout::{Cell, Part, PoolKind};
use crate::sglang::result::Place;

/// How the synthetic transfer goes wrong.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Defect {
    None,
    /// Decode rank r takes head `r % heads` instead of `r / replicas`.
    ReplicaModulo,
    /// V head slices sized with K's head bytes.
    VWithKLength,
    /// One page more than the request written (onto the padding page).
    PastLastPage,
    /// Every replica writes its head, and one replica's bytes differ.
    ConflictingReplicas,
}

fn pools(side: Side, heads: u32, tp: u32, v: u32) -> EnginePools {
    EnginePools::small_mha(side, heads, tp, v)
}

/// A push of `placement` from `p` to `d`, every replica writing when
/// `all_replicas`, with `defect`.
fn simulate(p: EnginePools, d: EnginePools, all_replicas: bool, defect: Defect) -> Observed {
    let placement = Placement {
        prefill_pages: vec![3, 1],
        decode_pages: vec![2, 5],
        prompt_len: 6,
    };
    let mut prefill_before: Images = (0..p.attn_tp)
        .map(|r| {
            (0..p.regions(r).len() as u32)
                .map(|i| prefill_region(&p, r, i, &placement.prefill_pages))
                .collect()
        })
        .collect();
    if defect == Defect::ConflictingReplicas {
        for image in &mut prefill_before[1] {
            for b in image.iter_mut() {
                *b = b.wrapping_add(1).max(1);
            }
        }
    }
    let mut decode_after: Images = (0..d.attn_tp)
        .map(|r| d.regions(r).iter().map(|x| decode_region(x.len)).collect())
        .collect();
    let mut writes = Vec::new();
    let mut pages: Vec<(u32, u32)> = placement
        .prefill_pages
        .iter()
        .copied()
        .zip(placement.decode_pages.iter().copied())
        .collect();
    if defect == Defect::PastLastPage {
        pages.push((4, 0));
    }
    let total = match d.kind {
        PoolKind::Mha { total_heads, .. } => total_heads,
        PoolKind::Mla { .. } => 1,
    };
    for dr in 0..d.attn_tp {
        for region in d.regions(dr) {
            for &(pp, dp) in &pages {
                for row in 0..d.page_size {
                    for &head in &region.heads {
                        let src_head = if defect == Defect::ReplicaModulo {
                            dr % total
                        } else {
                            head
                        };
                        let len = if defect == Defect::VWithKLength && region.part == Part::V {
                            8 * 2
                        } else {
                            region.head_bytes
                        };
                        let holders: Vec<u32> = (0..p.attn_tp)
                            .filter(|&r| p.global_heads(r).contains(&src_head))
                            .collect();
                        let n = if all_replicas { holders.len() } else { 1 };
                        for &pr in &holders[..n] {
                            let cell = |page, head| Cell {
                                layer: region.layer,
                                part: region.part,
                                page,
                                row,
                                head,
                                byte: 0,
                            };
                            let (si, so) = p.offset_of(pr, &cell(pp, src_head)).expect("source");
                            let (di, doff) = d.offset_of(dr, &cell(dp, head)).expect("dest");
                            let src = &prefill_before[pr as usize][si as usize];
                            let bytes = src[so as usize..(so + len) as usize].to_vec();
                            decode_after[dr as usize][di as usize]
                                [doff as usize..(doff + len) as usize]
                                .copy_from_slice(&bytes);
                            writes.push(Write {
                                xfer: pr as usize,
                                pair: writes.len(),
                                source: Place {
                                    rank: pr,
                                    region: si,
                                    offset: so,
                                },
                                destination: Place {
                                    rank: dr,
                                    region: di,
                                    offset: doff,
                                },
                                len,
                            });
                        }
                    }
                }
            }
        }
    }
    Observed {
        prefill_after: prefill_before.clone(),
        prefill: p,
        decode: d,
        placement,
        prefill_before,
        decode_after,
        writes,
    }
}

fn oracles(j: &Judged) -> std::collections::BTreeSet<&'static str> {
    j.violations.iter().map(|v| v.oracle).collect()
}

#[test]
fn a_correct_transfer_passes_every_oracle() {
    for (ph, pt, dt, v) in [
        (2, 1, 4, 8),
        (8, 2, 4, 8),
        (8, 4, 2, 8),
        (2, 1, 2, 16),
        (4, 2, 2, 8),
    ] {
        let o = simulate(
            pools(Side::Prefill, ph, pt, v),
            pools(Side::Decode, ph, dt, v),
            false,
            Defect::None,
        );
        let j = judge(&o);
        assert!(
            j.violations.is_empty(),
            "{ph} {pt}->{dt}: {:?}",
            j.violations
        );
        assert_eq!(j.redundant_bytes, 0);
    }
}

#[test]
fn identical_replicas_writing_twice_are_redundant_not_violations() {
    let o = simulate(
        pools(Side::Prefill, 2, 4, 8),
        pools(Side::Decode, 2, 1, 8),
        true,
        Defect::None,
    );
    let j = judge(&o);
    assert!(j.violations.is_empty(), "{:?}", j.violations);
    assert!(j.redundant_bytes > 0 && j.redundant_pairs > 0);
}

#[test]
fn replicas_writing_different_bytes_violate_no_double_write() {
    let o = simulate(
        pools(Side::Prefill, 2, 4, 8),
        pools(Side::Decode, 2, 1, 8),
        true,
        Defect::ConflictingReplicas,
    );
    assert!(oracles(&judge(&o)).contains("no_double_write"));
}

#[test]
fn a_modulo_replica_map_violates_pairing() {
    let o = simulate(
        pools(Side::Prefill, 2, 1, 8),
        pools(Side::Decode, 2, 4, 8),
        false,
        Defect::ReplicaModulo,
    );
    let found = oracles(&judge(&o));
    assert!(found.contains("pairing"), "{found:?}");
    assert!(found.contains("transferred_or_zeroed"), "{found:?}");
}

#[test]
fn v_slices_sized_as_k_leave_v_uncovered() {
    let o = simulate(
        pools(Side::Prefill, 2, 1, 16),
        pools(Side::Decode, 2, 2, 16),
        false,
        Defect::VWithKLength,
    );
    let j = judge(&o);
    assert_eq!(oracles(&j), ["coverage"].into(), "{:?}", j.violations);
    assert!(j
        .violations
        .iter()
        .all(|v| v.region.is_some_and(|r| r >= 2)));
}

#[test]
fn a_write_past_the_last_page_violates_neighbour_preservation() {
    let o = simulate(
        pools(Side::Prefill, 4, 2, 8),
        pools(Side::Decode, 4, 2, 8),
        false,
        Defect::PastLastPage,
    );
    let found = oracles(&judge(&o));
    assert!(found.contains("neighbour_preservation"), "{found:?}");
    assert!(found.contains("pairing"), "{found:?}");
}

#[test]
fn a_changed_prefill_byte_violates_neighbour_preservation() {
    let mut o = simulate(
        pools(Side::Prefill, 4, 2, 8),
        pools(Side::Decode, 4, 2, 8),
        false,
        Defect::None,
    );
    o.prefill_after[1][3][5] ^= 0xff;
    let j = judge(&o);
    assert_eq!(oracles(&j), ["neighbour_preservation"].into());
    assert_eq!(j.violations[0].side, Some(Side::Prefill));
}

#[test]
fn a_row_past_the_prompt_holds_prefills_byte_or_its_own_and_nothing_else() {
    let mut o = simulate(
        pools(Side::Prefill, 4, 2, 8),
        pools(Side::Decode, 4, 2, 8),
        false,
        Defect::None,
    );
    // Prompt 6, pages of 4: rows 2 and 3 of decode's page 5 are past it.
    let head = o.decode.global_heads(0)[0];
    let cell = Cell {
        layer: 0,
        part: Part::K,
        page: 5,
        row: 3,
        head,
        byte: 0,
    };
    let (region, offset) = o.decode.offset_of(0, &cell).expect("inside");
    let byte = &mut o.decode_after[0][region as usize][offset as usize];
    *byte = SENTINEL;
    assert!(judge(&o).violations.is_empty(), "untouched is allowed");
    let right = request_byte(&cell, 7);
    let wrong = if right ^ 0xff == SENTINEL {
        0x01
    } else {
        right ^ 0xff
    };
    o.decode_after[0][region as usize][offset as usize] = wrong;
    let j = judge(&o);
    assert_eq!(
        oracles(&j),
        ["transferred_or_zeroed"].into(),
        "{:?}",
        j.violations
    );
    assert!(j.violations[0].message.contains("past the prompt"));
}
