//! The receive post-process lowered to the three primitives a GPU runs
//! without kernels, in stream order: copy a page into a staging buffer,
//! copy a slice of the staging buffer back into a tensor, and memset.
//!
//! A head-major block-size conversion stages the page, then copies each
//! `(sub-page, head)` slice to its place (and zeroes any page padding, as
//! the host conversion does); token tails and stale blocks are memsets.
//! Block ids stay on the host: they only become addresses here, so no
//! block-id table is ever uploaded. [`run_on_memory`] executes a program
//! through [`KvMemory`]'s byte access, which is how the host tests check
//! that a program does exactly what [`super::post_process::apply`] does.

use super::post_process::KvMemory;
use super::post_process::{GroupPostProcess, PageGeometry, PostOp};

/// One device primitive. Offsets are bytes from the region's base.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceOp {
    /// Copy `len` bytes of tensor `region` at `offset` to the start of the staging buffer.
    Stage {
        /// The tensor (region index, in registration order).
        region: usize,
        /// Byte offset of the copied bytes in the tensor.
        offset: u64,
        /// Bytes copied.
        len: u64,
    },
    /// Copy `len` staging bytes from `from` to tensor `region` at `offset`.
    Unstage {
        /// The tensor written (region index, in registration order).
        region: usize,
        /// Byte offset in the staging buffer.
        from: u64,
        /// Byte offset of the destination in the tensor.
        offset: u64,
        /// Bytes copied.
        len: u64,
    },
    /// Zero `len` bytes of tensor `region` at `offset`.
    Zero {
        /// The tensor (region index, in registration order).
        region: usize,
        /// Byte offset of the first zeroed byte in the tensor.
        offset: u64,
        /// Bytes zeroed.
        len: u64,
    },
}

/// A post-process as device work: ops in order, and the staging buffer
/// size they need (0 when nothing is converted).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceProgram {
    /// The primitives, in stream order.
    pub ops: Vec<DeviceOp>,
    /// Size of the staging buffer the `Stage`/`Unstage` ops use, in bytes.
    pub staging_bytes: u64,
}

impl DeviceProgram {
    /// Append `op`, fusing it with the previous op where the two touch
    /// adjacent bytes in the same direction (never across a `Stage`).
    fn push(&mut self, op: DeviceOp) {
        use DeviceOp::{Unstage, Zero};
        if let Some(last) = self.ops.last_mut() {
            match (last, op) {
                (
                    Zero {
                        region: r0,
                        offset: o0,
                        len: l0,
                    },
                    Zero {
                        region,
                        offset,
                        len,
                    },
                ) if *r0 == region && *o0 + *l0 == offset => {
                    *l0 += len;
                    return;
                }
                (
                    Unstage {
                        region: r0,
                        from: f0,
                        offset: o0,
                        len: l0,
                    },
                    Unstage {
                        region,
                        from,
                        offset,
                        len,
                    },
                ) if *r0 == region && *f0 + *l0 == from && *o0 + *l0 == offset => {
                    *l0 += len;
                    return;
                }
                _ => {}
            }
        }
        if len_of(&op) > 0 {
            self.ops.push(op);
        }
    }
}

fn len_of(op: &DeviceOp) -> u64 {
    match *op {
        DeviceOp::Stage { len, .. }
        | DeviceOp::Unstage { len, .. }
        | DeviceOp::Zero { len, .. } => len,
    }
}

/// The `(staging offset, page offset, len)` slices that put a page received
/// as `ratio` sub-pages (each `[head][token][content]`) back into
/// `[head][token][content]`; the same index map as
/// [`super::post_process::convert_block_size`].
pub fn conversion_slices(geometry: &PageGeometry, ratio: u64) -> Vec<(u64, u64, u64)> {
    let (heads, n, c) = (geometry.heads, geometry.tokens, geometry.head_token_bytes);
    if ratio == 0 {
        return Vec::new();
    }
    let sub_tokens = n / ratio;
    let len = sub_tokens * c;
    let mut slices = Vec::with_capacity((ratio * heads) as usize);
    for j in 0..ratio {
        for h in 0..heads {
            slices.push(((j * heads + h) * len, (h * n + j * sub_tokens) * c, len));
        }
    }
    slices
}

/// Lower the planned operations for every attention cache (every region),
/// in the order [`super::post_process::apply`] runs them.
pub fn lower(plans: &[GroupPostProcess], geometries: &[PageGeometry]) -> DeviceProgram {
    let mut program = DeviceProgram::default();
    for plan in plans {
        for op in &plan.ops {
            for (region, g) in geometries.iter().enumerate() {
                match *op {
                    PostOp::ConvertBlockSize { block, ratio } => {
                        let page = u64::from(block) * g.block_stride;
                        program.staging_bytes = program.staging_bytes.max(g.block_len);
                        program.ops.push(DeviceOp::Stage {
                            region,
                            offset: page,
                            len: g.block_len,
                        });
                        let mut slices = conversion_slices(g, u64::from(ratio));
                        for &(from, at, len) in &slices {
                            program.push(DeviceOp::Unstage {
                                region,
                                from,
                                offset: page + at,
                                len,
                            });
                        }
                        // The host conversion starts from a zeroed page:
                        // bytes no slice covers (page padding) end up zero.
                        slices.sort_by_key(|&(_, at, _)| at);
                        let mut next = 0;
                        for (_, at, len) in slices.into_iter().chain([(0, g.block_len, 0)]) {
                            let at = at.min(g.block_len);
                            if at > next {
                                program.push(DeviceOp::Zero {
                                    region,
                                    offset: page + next,
                                    len: at - next,
                                });
                            }
                            next = next.max(at + len);
                        }
                    }
                    PostOp::ZeroTokens { block, from_token } => {
                        for (offset, len) in g.token_tail_ranges(block, u64::from(from_token)) {
                            program.push(DeviceOp::Zero {
                                region,
                                offset,
                                len,
                            });
                        }
                    }
                    PostOp::ZeroTokensBefore { block, to_token } => {
                        for (offset, len) in g.token_head_ranges(block, u64::from(to_token)) {
                            program.push(DeviceOp::Zero {
                                region,
                                offset,
                                len,
                            });
                        }
                    }
                    PostOp::ZeroBlock { block } => program.push(DeviceOp::Zero {
                        region,
                        offset: u64::from(block) * g.block_stride,
                        len: g.block_len,
                    }),
                }
            }
        }
    }
    program
}

/// Execute `program` through byte access (the reference the device run is
/// compared with; also what a memory without device queues would do).
pub fn run_on_memory<M: KvMemory + ?Sized>(program: &DeviceProgram, memory: &mut M) {
    let mut staging = vec![0u8; program.staging_bytes as usize];
    for op in &program.ops {
        match *op {
            DeviceOp::Stage {
                region,
                offset,
                len,
            } => {
                let bytes = memory.read(region, offset, len);
                staging[..bytes.len()].copy_from_slice(&bytes);
            }
            DeviceOp::Unstage {
                region,
                from,
                offset,
                len,
            } => memory.write(
                region,
                offset,
                &staging[from as usize..(from + len) as usize],
            ),
            DeviceOp::Zero {
                region,
                offset,
                len,
            } => memory.zero(region, offset, len),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connector::post_process::{self, convert_block_size};
    use crate::geometry::KvLayout;
    use crate::memory::{HostArena, HostTensors};

    fn geometry(heads: u64, tokens: u64, c: u64, pad: u64, layout: KvLayout) -> PageGeometry {
        let block_len = heads * tokens * c + pad;
        PageGeometry {
            block_len,
            block_stride: block_len + 3,
            tokens,
            heads,
            head_token_bytes: c,
            layout,
        }
    }

    /// `regions` tensors of `blocks` pages, every byte distinct-ish and non-zero.
    fn tensors(g: &PageGeometry, regions: usize, blocks: u64, seed: u64) -> HostTensors {
        HostTensors(
            (0..regions)
                .map(|r| {
                    let arena = HostArena::new(g.block_stride * blocks);
                    for (i, b) in arena.write().iter_mut().enumerate() {
                        let h = (i as u64 + 1)
                            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                            .wrapping_add(seed ^ ((r as u64) << 40));
                        *b = 1 + (h >> 56) as u8 % 250;
                    }
                    arena
                })
                .collect(),
        )
    }

    fn snapshot(t: &HostTensors) -> Vec<Vec<u8>> {
        t.0.iter().map(HostArena::snapshot).collect()
    }

    fn plan(ops: Vec<PostOp>) -> Vec<GroupPostProcess> {
        vec![GroupPostProcess {
            group: 0,
            block_ids: Vec::new(),
            covered_sub_blocks: 0,
            first_covered_sub_block: 0,
            ratio: 1,
            needs_block_ids: true,
            ops,
        }]
    }

    /// The lowered program leaves exactly the bytes `apply` leaves.
    fn assert_same_as_apply(g: PageGeometry, ops: Vec<PostOp>) {
        let geometries = vec![g; 3];
        let plans = plan(ops);
        let mut expected = tensors(&g, 3, 6, 7);
        post_process::apply(&plans, &geometries, &mut expected);
        let mut lowered = tensors(&g, 3, 6, 7);
        let program = lower(&plans, &geometries);
        run_on_memory(&program, &mut lowered);
        assert_eq!(
            snapshot(&lowered),
            snapshot(&expected),
            "{g:?} {:?}",
            plans[0].ops
        );
    }

    #[test]
    fn slices_follow_the_host_conversion_index_map() {
        // 2 heads, 4 tokens, 1 byte per head-token, ratio 2 (the host unit test's page).
        let g = geometry(2, 4, 1, 0, KvLayout::Hnd);
        assert_eq!(
            conversion_slices(&g, 2),
            vec![(0, 0, 2), (2, 4, 2), (4, 2, 2), (6, 6, 2)]
        );
        // Applied to the received page they give what convert_block_size gives.
        let received = [0u8, 1, 10, 11, 2, 3, 12, 13];
        let mut out = [0u8; 8];
        for (from, at, len) in conversion_slices(&g, 2) {
            out[at as usize..(at + len) as usize]
                .copy_from_slice(&received[from as usize..(from + len) as usize]);
        }
        assert_eq!(out.to_vec(), convert_block_size(&received, &g, 2));
    }

    #[test]
    fn conversions_tails_and_blocks_match_the_host_post_process() {
        for layout in [KvLayout::Hnd, KvLayout::Nhd] {
            for (heads, tokens, c, pad) in [(1, 4, 2, 0), (2, 8, 3, 0), (3, 8, 1, 5), (4, 16, 2, 0)]
            {
                for ratio in [1u32, 2, 3, 4] {
                    let g = geometry(heads, tokens, c, pad, layout);
                    let sub = (tokens / u64::from(ratio)) as u32;
                    assert_same_as_apply(
                        g,
                        vec![
                            PostOp::ConvertBlockSize { block: 4, ratio },
                            PostOp::ConvertBlockSize { block: 1, ratio },
                            PostOp::ConvertBlockSize { block: 2, ratio },
                            PostOp::ZeroTokens {
                                block: 1,
                                from_token: sub,
                            },
                            PostOp::ZeroBlock { block: 2 },
                            PostOp::ZeroBlock { block: 3 },
                        ],
                    );
                    assert_same_as_apply(
                        g,
                        vec![PostOp::ZeroTokens {
                            block: 5,
                            from_token: 1,
                        }],
                    );
                    assert_same_as_apply(
                        g,
                        vec![
                            PostOp::ZeroTokensBefore {
                                block: 3,
                                to_token: sub,
                            },
                            PostOp::ZeroTokensBefore {
                                block: 0,
                                to_token: 1,
                            },
                        ],
                    );
                }
            }
        }
    }

    #[test]
    fn adjacent_memsets_fuse_into_one() {
        let mut g = geometry(2, 4, 2, 0, KvLayout::Nhd);
        g.block_stride = g.block_len;
        let program = lower(
            &plan(vec![
                PostOp::ZeroTokens {
                    block: 0,
                    from_token: 2,
                },
                PostOp::ZeroBlock { block: 1 },
                PostOp::ZeroBlock { block: 2 },
                PostOp::ZeroBlock { block: 4 },
            ]),
            &[g],
        );
        assert_eq!(
            program,
            DeviceProgram {
                ops: vec![
                    DeviceOp::Zero {
                        region: 0,
                        offset: 8,
                        len: 40
                    },
                    DeviceOp::Zero {
                        region: 0,
                        offset: 64,
                        len: 16
                    },
                ],
                staging_bytes: 0,
            }
        );
    }

    #[test]
    fn a_conversion_stages_the_page_then_places_each_head_slice() {
        let g = geometry(2, 4, 1, 2, KvLayout::Hnd);
        let program = lower(
            &plan(vec![PostOp::ConvertBlockSize { block: 1, ratio: 2 }]),
            &[g],
        );
        let page = g.block_stride;
        assert_eq!(program.staging_bytes, 10);
        assert_eq!(
            program.ops,
            vec![
                DeviceOp::Stage {
                    region: 0,
                    offset: page,
                    len: 10
                },
                DeviceOp::Unstage {
                    region: 0,
                    from: 0,
                    offset: page,
                    len: 2
                },
                DeviceOp::Unstage {
                    region: 0,
                    from: 2,
                    offset: page + 4,
                    len: 2
                },
                DeviceOp::Unstage {
                    region: 0,
                    from: 4,
                    offset: page + 2,
                    len: 2
                },
                DeviceOp::Unstage {
                    region: 0,
                    from: 6,
                    offset: page + 6,
                    len: 2
                },
                DeviceOp::Zero {
                    region: 0,
                    offset: page + 8,
                    len: 2
                },
            ]
        );
    }
}
