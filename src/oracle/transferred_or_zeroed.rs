//! Transferred-or-zeroed: after the receive post-process, every byte of the
//! request's decode attention transfer blocks holds prefill's byte for its
//! coordinate (required for tokens below M) or zero (allowed only for
//! tokens at or past M); every byte of a transferred mamba slot's state
//! (in every region holding state) equals prefill's state exactly.

use crate::geometry::GroupKind;
use crate::layout::{EngineLayout, Side};
use crate::memory::ArenaBytes;
use crate::pattern::{attention_cell_pattern, mamba_pattern, SENTINEL};

use super::input::OracleInput;
use super::memory::{images, Checked, RankGroup, Tallies, Tally};
use super::violation::Violation;
use crate::pattern::InitialFill;

/// The oracle's name, as violations and reports carry it.
pub const NAME: &str = "transferred_or_zeroed";

const STALE: &str = "stale";
/// Stale past M, where a zero would have been fine.
const STALE_TAIL: &str = "stale_tail";
const ZEROED: &str = "zeroed";
const WRONG: &str = "wrong";

/// Every byte of the request's attention blocks holds prefill's byte for its token, or zero.
pub fn check(input: &OracleInput) -> Vec<Violation> {
    let mut out = Vec::new();
    for layout in input.case.engines(Side::Decode) {
        // A rank nothing accessed still holds its initial fill: judge that.
        let initial;
        let after = match images(NAME, input, layout, false) {
            Ok(Checked::Images(images)) => &images.after,
            Ok(Checked::Untouched(fill)) => match initial_images(input, layout, fill) {
                Ok(images) => {
                    initial = images;
                    &initial
                }
                Err(v) => {
                    out.push(*v);
                    continue;
                }
            },
            Err(v) => {
                out.push(*v);
                continue;
            }
        };
        let mut tallies = Tallies::default();
        for (g, kind) in input.case.model().groups.iter().enumerate() {
            let at = RankGroup {
                input,
                layout,
                group: g as u32,
            };
            match kind {
                GroupKind::Attention => attention(at, after, &mut tallies),
                GroupKind::Mamba => mamba(at, after, &mut tallies),
            }
        }
        let m = input.transferred_tokens;
        out.extend(
            tallies.into_violations(NAME, Side::Decode, layout.tp_rank(), |fault, t, v| {
                let v = Violation {
                    message: describe(fault, t, m),
                    ..v
                };
                if fault == STALE_TAIL {
                    v.expected(format!("0x00 or prefill's {:#04x}", t.expected))
                } else {
                    v
                }
            }),
        );
    }
    out
}

/// Every region of a rank as its initial fill left it. Each image is
/// allocated fallibly: memory the system refuses is a violation saying the
/// check could not run (kvgeom's own memory, not the connector's bytes),
/// never an abort.
fn initial_images(
    input: &OracleInput,
    layout: &EngineLayout,
    fill: &InitialFill,
) -> Result<Vec<ArenaBytes>, Box<Violation>> {
    let fail = |message: String| {
        Box::new(Violation::new(NAME, message).on(Some(layout.side()), Some(layout.tp_rank())))
    };
    (0..layout.num_regions())
        .map(|region| {
            let mut image = ArenaBytes::zeroed(layout.region_len()).map_err(|e| {
                fail(format!(
                    "cannot hold the initial image of region {region} to check it: {e}"
                ))
            })?;
            fill.fill_region(&input.case, region, &mut image)
                .map(|()| image)
                .map_err(|e| fail(format!("cannot recompute the initial fill: {e}")))
        })
        .collect()
}

fn describe(fault: &'static str, t: &Tally, m: u32) -> String {
    let what = match fault {
        STALE => "bytes still hold the sentinel (neither transferred nor zeroed)",
        STALE_TAIL => "bytes still hold the sentinel; past M they must be zeroed or transferred",
        ZEROED => "bytes were zeroed although their tokens were transferred",
        _ => "bytes hold neither prefill's byte for their coordinate nor an allowed zero",
    };
    match &t.tokens {
        Some(tokens) => format!(
            "{} {what}; tokens {tokens:?} (transferred tokens: {m})",
            t.count
        ),
        None => format!("{} mamba state {what}", t.count),
    }
}

fn fault_of(found: u8) -> &'static str {
    match found {
        SENTINEL => STALE,
        0 => ZEROED,
        _ => WRONG,
    }
}

fn attention(at: RankGroup<'_>, after: &[ArenaBytes], tallies: &mut Tallies) {
    let group = at.group;
    let case = &at.input.case;
    let m = at.input.transferred_tokens;
    let prefill_tokens = case.group_blocks(Side::Prefill, group).len() as u64
        * u64::from(case.logical_block(Side::Prefill));
    let view = at.layout.own_view();
    let c = at.layout.bytes_per_head_token() as usize;
    let u = at.layout.unified_page();
    let b_d = at.layout.logical_block();
    let mut expected = vec![0u8; c];
    for (pos, &block) in case.group_blocks(Side::Decode, group).iter().enumerate() {
        if !case.is_decode_transfer_block(block) {
            continue;
        }
        for (region, image) in after.iter().enumerate() {
            for t_in in 0..b_d {
                let token = pos as u32 * b_d + t_in;
                let prefill_had = u64::from(token) < prefill_tokens;
                for h in 0..at.layout.heads().count {
                    attention_cell_pattern(
                        region as u32,
                        group,
                        token,
                        at.layout.global_head(h),
                        0,
                        &mut expected,
                    );
                    let start = u64::from(block) * u + at.layout.cell_offset(view, t_in, h);
                    let found = &image[start as usize..start as usize + c];
                    // Whole cells first; byte by byte only where one is bad.
                    if found == &expected[..] || (token >= m && found.iter().all(|&f| f == 0)) {
                        continue;
                    }
                    for (k, (&e, &f)) in expected.iter().zip(found).enumerate() {
                        let ok = if token < m {
                            f == e
                        } else {
                            f == 0 || (prefill_had && f == e)
                        };
                        if !ok {
                            let fault = match fault_of(f) {
                                STALE if token >= m => STALE_TAIL,
                                other => other,
                            };
                            tallies.add(
                                region as u32,
                                block,
                                fault,
                                start + k as u64,
                                Some(token),
                                e,
                                f,
                            );
                        }
                    }
                }
            }
        }
    }
}

fn mamba(at: RankGroup<'_>, after: &[ArenaBytes], tallies: &mut Tallies) {
    let group = at.group;
    let case = &at.input.case;
    let Some(page) = at.layout.mamba() else {
        return;
    };
    let u = at.layout.unified_page();
    for &block in case.group_blocks(Side::Decode, group) {
        if !case.is_decode_transfer_block(block) {
            continue;
        }
        let state_regions = at.layout.state_regions() as usize;
        for (region, image) in after.iter().enumerate().take(state_regions) {
            for (part, sub) in page.parts() {
                let mut expected = vec![0u8; sub.size as usize];
                mamba_pattern(
                    region as u32,
                    group,
                    part,
                    at.layout.mamba_global_byte(part, 0),
                    &mut expected,
                );
                let start = u64::from(block) * u + sub.offset;
                let found = &image[start as usize..(start + sub.size) as usize];
                if found == &expected[..] {
                    continue;
                }
                for (k, (&e, &f)) in expected.iter().zip(found).enumerate() {
                    if e != f {
                        tallies.add(
                            region as u32,
                            block,
                            fault_of(f),
                            start + k as u64,
                            None,
                            e,
                            f,
                        );
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::Coordinate;
    use crate::oracle::test_case::{only_violation, run, Fault};
    use crate::oracle::MemoryImages;
    use crate::pattern::pattern_byte;

    #[test]
    fn transferred_then_zeroed_blocks_pass() {
        assert_eq!(check(&run(Fault::None)), Vec::new());
    }

    #[test]
    fn a_skipped_zeroing_leaves_stale_bytes() {
        let (v, at) = only_violation(check, Fault::SkipZeroing);
        assert_eq!(at, (Some(Side::Decode), Some(0), Some(1), Some(3)));
        // Kernel block 11 of 96 bytes: tokens 40..48 (block position 1, tokens 16..24 inside it).
        assert_eq!((v.byte_range.clone(), v.bytes), (Some(1056..1152), 96));
        assert_eq!(v.found.as_deref(), Some("0xaa"));
        let first = pattern_byte(&Coordinate::Attention {
            region: 1,
            group: 0,
            token: 40,
            head: 0,
            byte: 0,
        });
        assert_eq!(v.expected, Some(format!("0x00 or prefill's {first:#04x}")));
        assert_eq!(
            v.message,
            "96 bytes still hold the sentinel; past M they must be zeroed or transferred; tokens 40..48 (transferred tokens: 28)"
        );
    }

    #[test]
    fn zeroing_transferred_tokens_is_caught() {
        let mut input = run(Fault::None);
        let mut images: MemoryImages = input.memory(Side::Decode, 0).expect("images").clone();
        // Kernel block 9 holds tokens 24..32; tokens 24..28 were transferred.
        images.after[0][9 * 96..10 * 96].fill(0);
        input.set_memory(Side::Decode, 0, images);
        let v = check(&input);
        assert_eq!(v.len(), 1, "{v:#?}");
        assert_eq!((v[0].region, v[0].local_block), (Some(0), Some(3)));
        assert_eq!((v[0].byte_range.clone(), v[0].bytes), (Some(864..912), 48));
        assert_eq!(v[0].found.as_deref(), Some("0x00"));
        assert_eq!(
            v[0].message,
            "48 bytes were zeroed although their tokens were transferred; tokens 24..28 (transferred tokens: 28)"
        );
    }

    #[test]
    fn a_state_from_the_wrong_slot_is_caught() {
        let mut input = run(Fault::None);
        let mut images = input.memory(Side::Decode, 0).expect("images").clone();
        // kda_b's slot 6 receives kda_a's state of slot 0 (region 1).
        let (a, b) = (0usize, 6 * 288usize);
        let state = images.after[1][a..a + 112].to_vec();
        images.after[1][b..b + 112].copy_from_slice(&state);
        input.set_memory(Side::Decode, 0, images);
        let v = check(&input);
        assert_eq!(v.len(), 1, "{v:#?}");
        assert_eq!((v[0].region, v[0].local_block), (Some(1), Some(6)));
        assert_eq!(v[0].byte_range.as_ref().map(|r| r.start), Some(6 * 288));
        assert!(v[0].bytes > 100, "{}", v[0].bytes);
        assert!(v[0].message.ends_with("mamba state bytes hold neither prefill's byte for their coordinate nor an allowed zero"));
    }
}
