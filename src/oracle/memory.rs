//! Shared by the byte-level oracles: fetching a rank's images with their
//! sizes checked, and tallying bad bytes per (region, block, kind of fault).

use std::collections::BTreeMap;
use std::ops::Range;

use crate::layout::{EngineLayout, Side};

use super::input::{BeforeImage, MemoryImages, OracleInput, RankMemory};
use super::violation::Violation;
use crate::pattern::InitialFill;

/// A rank's memory as the byte-level oracles get it, sizes checked.
pub(crate) enum Checked<'a> {
    /// Images after (and what was before).
    Images(&'a MemoryImages),
    /// Nothing accessed the rank: it still holds its initial fill.
    Untouched(&'a InitialFill),
}

/// One group of one rank, as a byte-level oracle checks it.
#[derive(Clone, Copy)]
pub(crate) struct RankGroup<'a> {
    /// The case.
    pub input: &'a OracleInput,
    /// The rank's layout.
    pub layout: &'a EngineLayout,
    /// The KV-cache group.
    pub group: u32,
}

/// The rank's memory, or a violation saying why it cannot be checked.
pub(crate) fn images<'a>(
    oracle: &'static str,
    input: &'a OracleInput,
    layout: &EngineLayout,
    need_before: bool,
) -> Result<Checked<'a>, Box<Violation>> {
    let (side, rank) = (layout.side(), layout.tp_rank());
    let fail = |msg: String| Box::new(Violation::new(oracle, msg).on(Some(side), Some(rank)));
    let images = match input.rank_memory(side, rank) {
        None => {
            return Err(fail(format!(
                "{side} rank {rank} has no memory images; the byte-level check cannot run"
            )))
        }
        Some(RankMemory::Untouched(fill)) => return Ok(Checked::Untouched(fill)),
        Some(RankMemory::Images(images)) => images,
    };
    let regions = layout.num_regions() as usize;
    let lens = |set: &mut dyn Iterator<Item = usize>| set.collect::<Vec<usize>>();
    let mut sets = vec![("after", lens(&mut images.after.iter().map(|a| a.len())))];
    if let (true, BeforeImage::Copied(before)) = (need_before, &images.before) {
        sets.insert(0, ("before", lens(&mut before.iter().map(Vec::len))));
    }
    for (name, set) in sets {
        if set.len() != regions {
            return Err(fail(format!(
                "{name} image has {} regions, the layout has {regions}",
                set.len()
            )));
        }
        if let Some((i, len)) = set
            .iter()
            .enumerate()
            .find(|(_, &len)| len as u64 != layout.region_len())
        {
            let v = fail(format!(
                "{name} image of region {i} has {len} bytes, the layout needs {}",
                layout.region_len()
            ));
            return Err(Box::new(v.region(Some(i as u32))));
        }
    }
    Ok(Checked::Images(images))
}

/// Bad bytes of one (region, block, fault).
pub(crate) struct Tally {
    pub count: u64,
    pub bytes: Range<u64>,
    pub tokens: Option<Range<u32>>,
    pub expected: u8,
    pub found: u8,
}

/// Bad bytes grouped by (region, block, fault), in order.
#[derive(Default)]
pub(crate) struct Tallies {
    map: BTreeMap<(u32, u32, &'static str), Tally>,
}

impl Tallies {
    #[allow(clippy::too_many_arguments)]
    pub fn add(
        &mut self,
        region: u32,
        block: u32,
        fault: &'static str,
        offset: u64,
        token: Option<u32>,
        expected: u8,
        found: u8,
    ) {
        let t = self.map.entry((region, block, fault)).or_insert(Tally {
            count: 0,
            bytes: offset..offset + 1,
            tokens: token.map(|t| t..t + 1),
            expected,
            found,
        });
        t.count += 1;
        t.bytes = t.bytes.start.min(offset)..t.bytes.end.max(offset + 1);
        if let (Some(r), Some(tok)) = (&mut t.tokens, token) {
            *r = r.start.min(tok)..r.end.max(tok + 1);
        }
    }

    /// One violation per (region, block, fault), with the place, the byte
    /// range and the first expected/found bytes filled in; `finish` adds the
    /// message (and may refine the rest).
    pub fn into_violations(
        self,
        oracle: &'static str,
        side: Side,
        rank: u32,
        finish: impl Fn(&'static str, &Tally, Violation) -> Violation,
    ) -> Vec<Violation> {
        self.map
            .into_iter()
            .map(|((region, block, fault), t)| {
                let v = Violation::new(oracle, String::new())
                    .on(Some(side), Some(rank))
                    .region(Some(region))
                    .block(Some(block))
                    .bytes(t.bytes.clone(), t.count)
                    .expected(format!("{:#04x}", t.expected))
                    .found(format!("{:#04x}", t.found));
                finish(fault, &t, v)
            })
            .collect()
    }
}
