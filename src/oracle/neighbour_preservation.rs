//! Neighbour preservation: on every decode rank, every byte outside the
//! request's decode transfer blocks is unchanged (other requests' blocks and
//! the request's own prefix-hit blocks); prefill memory is unchanged.
//! "Unchanged" is against a copy taken before the transfer or, without
//! one, against the initial fill recomputed block by block; a rank nothing
//! accessed is unchanged by construction.

use crate::layout::{EngineLayout, Side};
use crate::memory::ArenaBytes;

use super::input::{BeforeImage, OracleInput};
use super::memory::{images, Checked, Tallies};
use super::violation::Violation;

/// The oracle's name, as violations and reports carry it.
pub const NAME: &str = "neighbour_preservation";

/// Every byte outside the request's blocks is unchanged.
pub fn check(input: &OracleInput) -> Vec<Violation> {
    let mut out = Vec::new();
    for side in [Side::Decode, Side::Prefill] {
        for layout in input.case.engines(side) {
            match images(NAME, input, layout, true) {
                Ok(Checked::Images(img)) => {
                    out.extend(compare(input, layout, &img.before, &img.after))
                }
                Ok(Checked::Untouched(_)) => {}
                Err(v) => out.push(*v),
            }
        }
    }
    out
}

fn compare(
    input: &OracleInput,
    layout: &EngineLayout,
    before: &BeforeImage,
    after: &[ArenaBytes],
) -> Vec<Violation> {
    let side = layout.side();
    let u = layout.unified_page() as usize;
    let mut tallies = Tallies::default();
    let mut page = vec![0u8; u];
    for (region, a) in after.iter().enumerate() {
        for block in 0..layout.num_logical_blocks() {
            if side == Side::Decode && input.case.is_decode_transfer_block(block) {
                continue;
            }
            let range = block as usize * u..(block as usize + 1) * u;
            let b: &[u8] = match before {
                BeforeImage::Copied(images) => &images[region][range.clone()],
                BeforeImage::Recomputed(fill) => {
                    if let Err(e) = fill.fill_block(&input.case, region as u32, block, &mut page) {
                        let v =
                            Violation::new(NAME, format!("cannot recompute the initial fill: {e}"))
                                .on(Some(side), Some(layout.tp_rank()));
                        return vec![v];
                    }
                    &page
                }
            };
            if b == &a[range.clone()] {
                continue;
            }
            for (k, (&e, &f)) in b.iter().zip(&a[range.clone()]).enumerate() {
                if e != f {
                    tallies.add(
                        region as u32,
                        block,
                        "changed",
                        (range.start + k) as u64,
                        None,
                        e,
                        f,
                    );
                }
            }
        }
    }
    let owned = |block: u32| match side {
        Side::Decode if input.case.owner(side, block).is_some() => "the request's prefix-hit block",
        Side::Decode => "a block the request does not own",
        Side::Prefill => "prefill memory, which a transfer must only read",
    };
    tallies.into_violations(NAME, side, layout.tp_rank(), |_, t, v| {
        let what = v.local_block.map_or("memory", owned);
        Violation {
            message: format!("{} bytes changed in {what}", t.count),
            ..v
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oracle::test_case::{only_violation, run, Fault};
    use crate::pattern::foreign_byte;

    #[test]
    fn untouched_neighbours_pass() {
        assert_eq!(check(&run(Fault::None)), Vec::new());
    }

    #[test]
    fn a_changed_neighbour_byte_is_caught() {
        let (v, at) = only_violation(check, Fault::WriteNeighbourByte);
        assert_eq!(at, (Some(Side::Decode), Some(0), Some(0), Some(2)));
        assert_eq!((v.byte_range.clone(), v.bytes), (Some(581..582), 1));
        let before = foreign_byte(Side::Decode, 0, 0, 581);
        assert_eq!(v.expected, Some(format!("{before:#04x}")));
        assert_eq!(v.found, Some(format!("{:#04x}", before.wrapping_add(1))));
        assert_eq!(
            v.message,
            "1 bytes changed in a block the request does not own"
        );
    }

    #[test]
    fn a_change_to_prefill_memory_is_caught() {
        let mut input = run(Fault::None);
        let mut images = input.memory(Side::Prefill, 1).expect("images").clone();
        images.after[1][100..104].fill(0);
        input.set_memory(Side::Prefill, 1, images);
        let v = check(&input);
        assert_eq!(v.len(), 1, "{v:#?}");
        assert_eq!(
            (v[0].side, v[0].rank, v[0].region, v[0].local_block),
            (Some(Side::Prefill), Some(1), Some(1), Some(1))
        );
        assert_eq!((v[0].byte_range.clone(), v[0].bytes), (Some(100..104), 4));
        assert_eq!(
            v[0].message,
            "4 bytes changed in prefill memory, which a transfer must only read"
        );
    }

    #[test]
    fn missing_or_mis_sized_images_are_reported_not_skipped() {
        let mut input = run(Fault::None);
        let mut images = input.memory(Side::Decode, 0).expect("images").clone();
        let short = images.after[1][..images.after[1].len() - 1].to_vec();
        images.after[1] = short.into();
        input.set_memory(Side::Decode, 0, images);
        let v = check(&input);
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].region, Some(1));
        assert_eq!(
            v[0].message,
            "after image of region 1 has 2303 bytes, the layout needs 2304"
        );
    }
}
