//! Where each conv sub-projection of a mamba page moves between one local
//! rank and one peer rank of an engine with another TP size (vLLM's
//! `MambaConvSplitInfo`), under the two answers the connector has had:
//!
//! - [`ConvSplit::PeerWidths`] (kvgeom): every piece is located from both
//!   engines' own widths, as the byte range of the full (all-rank) state
//!   the two ranks share. Sharded sub-projections give vLLM's offsets;
//!   replicated Mamba2 groups (B and C when TP does not divide `n_groups`)
//!   are moved once, whole, into every decode rank that holds them.
//! - [`ConvSplit::LocalWidthsScaled`] (vLLM 0.33.0): the peer's offsets are
//!   this engine's widths scaled by the TP ratio, which is right only when
//!   every sub-projection is sharded on both engines.

use super::policy::ConvSplit;
use crate::geometry::{MambaSpec, SubRegion};

/// One rank of one engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RankAt {
    /// The engine's TP size.
    pub tp_size: u32,
    /// The rank.
    pub tp_rank: u32,
}

/// How one local rank and one peer rank exchange the conv state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvPeer {
    /// The local rank.
    pub local: RankAt,
    /// The peer rank.
    pub peer: RankAt,
    /// Whether the local rank is the destination (decode).
    pub local_is_destination: bool,
    /// The local rank's position among the ranks it exchanges with in one
    /// transfer (vLLM's source index of a split list), or among the prefill
    /// ranks that write the same decode rank (push with `P_TP > D_TP`).
    pub position: u32,
    /// How many ranks share that exchange (1 when one rank serves another).
    pub ranks: u32,
}

/// One conv sub-projection's piece: where it lies in the local page and in
/// the peer's page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvPiece {
    /// Bytes in the local rank's page.
    pub local: SubRegion,
    /// Bytes in the peer rank's page.
    pub remote: SubRegion,
}

/// The piece of every conv sub-projection, in page order, from both
/// engines' widths: the bytes of the full state both ranks hold and the
/// destination needs from this source. Where several source ranks hold the
/// same replicated bytes for one destination, each moves its share, so that
/// no destination byte is written twice.
pub fn conv_pieces(spec: &MambaSpec, p: &ConvPeer) -> Vec<ConvPiece> {
    let (dest, source) = if p.local_is_destination {
        (p.local, p.peer)
    } else {
        (p.peer, p.local)
    };
    let local_offsets = spec.conv_offsets(p.local.tp_size);
    let peer_offsets = spec.conv_offsets(p.peer.tp_size);
    (0..spec.conv_dims.len())
        .map(|j| {
            let range = |r: RankAt, sizes: &[SubRegion]| {
                let start = spec.conv_global_start(j, r.tp_size, r.tp_rank);
                start..start + sizes[j].size
            };
            let (d, s) = if p.local_is_destination {
                (range(dest, &local_offsets), range(source, &peer_offsets))
            } else {
                (range(dest, &peer_offsets), range(source, &local_offsets))
            };
            let (mut start, mut end) = (d.start.max(s.start), d.end.min(s.end));
            // Several sources holding the same bytes for this destination:
            // each moves one share (the shares cover the bytes exactly also
            // when they do not divide evenly).
            if spec.is_replicated(j, source.tp_size) && p.ranks > 1 {
                let (len, n, i) = (end - start, u64::from(p.ranks), u64::from(p.position));
                (start, end) = (start + i * len / n, start + (i + 1) * len / n);
            }
            let size = end.saturating_sub(start);
            let in_page = |r: RankAt, offsets: &[SubRegion]| SubRegion {
                offset: offsets[j].offset + start - spec.conv_global_start(j, r.tp_size, r.tp_rank),
                size,
            };
            ConvPiece {
                local: in_page(p.local, &local_offsets),
                remote: in_page(p.peer, &peer_offsets),
            }
        })
        .collect()
}

/// vLLM 0.33.0's `remote_conv_offsets`: the pieces of the peer's page,
/// from this engine's sub-projection sizes `local_sizes`. With `tp_ratio >=
/// 1` the local rank takes slice `slice` of each (bigger) peer
/// sub-projection; below 0 each peer sub-projection is taken as this
/// engine's size divided by the ratio.
pub fn scaled_remote_offsets(local_sizes: &[u64], slice: u64, tp_ratio: i32) -> Vec<SubRegion> {
    let mut base = 0;
    local_sizes
        .iter()
        .map(|&size| {
            if tp_ratio >= 1 {
                let sub = SubRegion {
                    offset: base + slice * size,
                    size,
                };
                base += size * tp_ratio.unsigned_abs() as u64;
                sub
            } else {
                let remote_size = size / u64::from(tp_ratio.unsigned_abs());
                let sub = SubRegion {
                    offset: base,
                    size: remote_size,
                };
                base += remote_size;
                sub
            }
        })
        .collect()
}

/// The pieces of the peer's page one remote list reads or writes, under
/// `policy`.
pub fn remote_conv_offsets(
    policy: ConvSplit,
    spec: &MambaSpec,
    p: &ConvPeer,
    tp_ratio: i32,
) -> Vec<SubRegion> {
    match policy {
        ConvSplit::PeerWidths => conv_pieces(spec, p).iter().map(|c| c.remote).collect(),
        ConvSplit::LocalWidthsScaled => {
            let sizes: Vec<u64> = spec
                .conv_offsets(p.local.tp_size)
                .iter()
                .map(|s| s.size)
                .collect();
            let slice = u64::from(p.local.tp_rank % tp_ratio.max(1) as u32);
            scaled_remote_offsets(&sizes, slice, tp_ratio)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::geometry::MambaKind;

    /// Falcon-H1-7B's Mamba2 state in channels (one row, one byte each):
    /// x = 3072, one group of 256 channels for B and for C.
    fn falcon() -> MambaSpec {
        MambaSpec {
            kind: MambaKind::Mamba2,
            conv_dims: vec![3072, 256, 256],
            conv_rows: 1,
            conv_dtype_bytes: 1,
            ssm_state_bytes: 24,
            n_groups: Some(1),
        }
    }

    fn pairs(pieces: &[ConvPiece]) -> Vec<((u64, u64), (u64, u64))> {
        pieces
            .iter()
            .map(|c| {
                (
                    (c.local.offset, c.local.size),
                    (c.remote.offset, c.remote.size),
                )
            })
            .collect()
    }

    fn peer(
        local: (u32, u32),
        peer: (u32, u32),
        dest: bool,
        position: u32,
        ranks: u32,
    ) -> ConvPeer {
        ConvPeer {
            local: RankAt {
                tp_size: local.0,
                tp_rank: local.1,
            },
            peer: RankAt {
                tp_size: peer.0,
                tp_rank: peer.1,
            },
            local_is_destination: dest,
            position,
            ranks,
        }
    }

    #[test]
    fn scaled_offsets_follow_the_tp_direction() {
        let sizes = [12, 12, 24];
        let bigger: Vec<_> = scaled_remote_offsets(&sizes, 1, 2)
            .iter()
            .map(|s| (s.offset, s.size))
            .collect();
        assert_eq!(bigger, [(12, 12), (36, 12), (72, 24)]);
        let smaller: Vec<_> = scaled_remote_offsets(&sizes, 0, -2)
            .iter()
            .map(|s| (s.offset, s.size))
            .collect();
        assert_eq!(smaller, [(0, 6), (6, 6), (12, 12)]);
    }

    #[test]
    fn replicated_groups_widths_follow_tp() {
        let m = falcon();
        let widths = |tp| (0..3).map(|j| m.rank_channels(j, tp)).collect::<Vec<_>>();
        // vLLM's Falcon-H1-7B: 3584 channels at TP1, 2048 at TP2, 1280 at TP4.
        assert_eq!(widths(1), [3072, 256, 256]);
        assert_eq!(widths(2), [1536, 256, 256]);
        assert_eq!(widths(4), [768, 256, 256]);
        assert!(!m.is_replicated(1, 1) && m.is_replicated(1, 2) && !m.is_replicated(0, 4));
        assert_eq!(m.conv_global_start(0, 4, 3), 3 * 768);
        assert_eq!(m.conv_global_start(2, 4, 3), 0);
    }

    #[test]
    fn pull_from_more_prefill_ranks_shares_the_replicated_group() {
        // D TP2 rank 1 reads from P TP4 ranks 2 and 3 (positions 0 and 1).
        let m = falcon();
        let first = conv_pieces(&m, &peer((2, 1), (4, 2), true, 0, 2));
        let second = conv_pieces(&m, &peer((2, 1), (4, 3), true, 1, 2));
        // D page: x 0..1536, B 1536..1792, C 1792..2048; P page: x 0..768, B 768..1024, C 1024..1280.
        assert_eq!(
            pairs(&first),
            [
                ((0, 768), (0, 768)),
                ((1536, 128), (768, 128)),
                ((1792, 128), (1024, 128))
            ]
        );
        assert_eq!(
            pairs(&second),
            [
                ((768, 768), (0, 768)),
                ((1664, 128), (896, 128)),
                ((1920, 128), (1152, 128))
            ]
        );
        // vLLM 0.33.0 reads the first half of P's B as B and its second half as C.
        let scaled = remote_conv_offsets(
            ConvSplit::LocalWidthsScaled,
            &m,
            &peer((2, 1), (4, 3), true, 1, 2),
            -2,
        );
        assert_eq!(
            scaled
                .iter()
                .map(|s| (s.offset, s.size))
                .collect::<Vec<_>>(),
            [(0, 768), (768, 128), (896, 128)]
        );
    }

    #[test]
    fn pull_from_fewer_prefill_ranks_reads_the_whole_group() {
        // D TP2 rank 1 reads from P TP1 (x 0..3072, B 3072..3328, C 3328..3584).
        let m = falcon();
        let pieces = conv_pieces(&m, &peer((2, 1), (1, 0), true, 0, 1));
        assert_eq!(
            pairs(&pieces),
            [
                ((0, 1536), (1536, 1536)),
                ((1536, 256), (3072, 256)),
                ((1792, 256), (3328, 256))
            ]
        );
        // vLLM 0.33.0: P's C as B, and bytes past P's conv state as C.
        let scaled = remote_conv_offsets(
            ConvSplit::LocalWidthsScaled,
            &m,
            &peer((2, 1), (1, 0), true, 0, 1),
            2,
        );
        assert_eq!(
            scaled
                .iter()
                .map(|s| (s.offset, s.size))
                .collect::<Vec<_>>(),
            [(1536, 1536), (3328, 256), (3840, 256)]
        );
    }

    #[test]
    fn push_writers_of_one_decode_rank_write_disjoint_shares() {
        // P TP4 ranks 2 and 3 write D TP2 rank 1.
        let m = falcon();
        let a = conv_pieces(&m, &peer((4, 2), (2, 1), false, 0, 2));
        let b = conv_pieces(&m, &peer((4, 3), (2, 1), false, 1, 2));
        assert_eq!(
            pairs(&a),
            [
                ((0, 768), (0, 768)),
                ((768, 128), (1536, 128)),
                ((1024, 128), (1792, 128))
            ]
        );
        assert_eq!(
            pairs(&b),
            [
                ((0, 768), (768, 768)),
                ((896, 128), (1664, 128)),
                ((1152, 128), (1920, 128))
            ]
        );
        // P TP1 writes the whole group to each of D TP2's ranks.
        let c = conv_pieces(&m, &peer((1, 0), (2, 1), false, 1, 2));
        assert_eq!(
            pairs(&c),
            [
                ((1536, 1536), (0, 1536)),
                ((3072, 256), (1536, 256)),
                ((3328, 256), (1792, 256))
            ]
        );
    }

    #[test]
    fn sharded_sub_projections_give_vllms_offsets() {
        // Nemotron-H-like: 8 groups, sharded at TP 1, 2 and 4.
        let m = MambaSpec {
            n_groups: Some(8),
            conv_dims: vec![64, 32, 32],
            ..falcon()
        };
        for (local, remote, ranks) in [(2, 1, 1), (4, 2, 1), (1, 2, 2), (2, 4, 2)] {
            let t = if local >= remote {
                (local / remote) as i32
            } else {
                -((remote / local) as i32)
            };
            for rank in 0..local {
                for position in 0..ranks {
                    let remote_rank = if t > 0 {
                        rank / t as u32
                    } else {
                        rank * ranks + position
                    };
                    let p = peer((local, rank), (remote, remote_rank), true, position, ranks);
                    assert_eq!(
                        remote_conv_offsets(ConvSplit::PeerWidths, &m, &p, t),
                        remote_conv_offsets(ConvSplit::LocalWidthsScaled, &m, &p, t),
                        "local TP{local} rank {rank} <- TP{remote} rank {remote_rank}"
                    );
                }
            }
        }
    }
}
