//! Everything the oracles look at for one case: the layouts and block lists,
//! the token counts, the resolved descriptor pairs tagged by direction, and
//! (optionally) memory images before and after the transfer.

use serde::Serialize;

use crate::geometry::{Geometry, Mode};
use crate::layout::{CaseLayout, Location, Side};
use crate::memory::ArenaBytes;
use crate::nixl::recording::ResolvedPair;
use crate::nixl::{DescRow, XferOp};
use crate::pattern::InitialFill;

use super::violation::PairRef;

/// One end of a pair.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Endpoint {
    /// The descriptor row (address, length, device) as posted.
    pub row: DescRow,
    /// What the row covers in the harness's layout model.
    pub location: Location,
}

/// A resolved pair, by direction of the bytes rather than by initiator:
/// a READ moves remote to local, a WRITE local to remote.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct OraclePair {
    /// Which pair of which transfer this is.
    pub id: PairRef,
    /// The transfer's direction from its initiator's view.
    pub op: XferOp,
    /// Only posted transfers move bytes.
    pub posted: bool,
    /// Where the bytes land (decode, in a correct case).
    pub destination: Endpoint,
    /// Where the bytes come from (prefill, in a correct case).
    pub source: Endpoint,
}

impl OraclePair {
    /// Orient a recorded pair by the direction its bytes move.
    pub fn from_resolved(p: ResolvedPair<Location>) -> Self {
        let local = Endpoint {
            row: p.local,
            location: p.local_location,
        };
        let remote = Endpoint {
            row: p.remote,
            location: p.remote_location,
        };
        let (destination, source) = match p.op {
            XferOp::Read => (local, remote),
            XferOp::Write => (remote, local),
        };
        Self {
            id: PairRef {
                xfer: p.xfer,
                pair: p.pair,
            },
            op: p.op,
            posted: p.posted,
            destination,
            source,
        }
    }
}

/// One rank's memory before the transfer and its region images (index =
/// region) after the receive post-process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemoryImages {
    /// What the rank held before the transfer.
    pub before: BeforeImage,
    /// Region images after the receive post-process (index = region): the
    /// arenas' bytes themselves, or copies.
    pub after: Vec<ArenaBytes>,
}

/// What a rank held before the transfer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BeforeImage {
    /// Region images copied before the transfer (index = region).
    Copied(Vec<Vec<u8>>),
    /// The harness's initial fill, recomputed block by block where an
    /// oracle compares against it (no copy of the memory is kept).
    Recomputed(InitialFill),
}

impl From<Vec<Vec<u8>>> for BeforeImage {
    fn from(images: Vec<Vec<u8>>) -> Self {
        BeforeImage::Copied(images)
    }
}

/// The memory the byte-level oracles have of one rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RankMemory {
    /// Images before and after.
    Images(MemoryImages),
    /// Nothing read or wrote the rank's memory during the case (its
    /// initial fill never even ran): it still holds `InitialFill`.
    Untouched(InitialFill),
}

/// One case as the oracles see it.
#[derive(Clone, Debug)]
pub struct OracleInput {
    /// Geometry, mode, every rank's layout and the request's block lists.
    pub case: CaseLayout,
    /// The prompt length N, in tokens.
    pub prompt_len: u32,
    /// Tokens whose KV is transferred (M).
    pub transferred_tokens: u32,
    /// Decode's local prefix hit in tokens (h).
    pub prefix_hit_tokens: u32,
    /// Every pair of every transfer of the request, in recording order.
    pub pairs: Vec<OraclePair>,
    decode_memory: Vec<Option<RankMemory>>,
    prefill_memory: Vec<Option<RankMemory>>,
}

impl OracleInput {
    /// A case without memory images; `M` follows the geometry's rule
    /// (`N - 1` for hybrid models, else `N`).
    pub fn new(
        case: CaseLayout,
        prompt_len: u32,
        prefix_hit_tokens: u32,
        pairs: Vec<ResolvedPair<Location>>,
    ) -> Self {
        let transferred_tokens = case.geometry().transferred_tokens(prompt_len);
        let decode_memory = vec![None; case.engines(Side::Decode).len()];
        let prefill_memory = vec![None; case.engines(Side::Prefill).len()];
        Self {
            case,
            prompt_len,
            transferred_tokens,
            prefix_hit_tokens,
            pairs: pairs.into_iter().map(OraclePair::from_resolved).collect(),
            decode_memory,
            prefill_memory,
        }
    }

    /// Overrides `M` (e.g. for a scheduler with another lookahead rule).
    pub fn with_transferred_tokens(mut self, tokens: u32) -> Self {
        self.transferred_tokens = tokens;
        self
    }

    /// Attaches a rank's memory images; ignored for a rank the case does not have.
    pub fn set_memory(&mut self, side: Side, rank: u32, images: MemoryImages) {
        self.set_rank_memory(side, rank, RankMemory::Images(images));
    }

    /// Records that nothing accessed a rank's memory during the case (it
    /// still holds `fill`); ignored for a rank the case does not have.
    pub fn set_untouched(&mut self, side: Side, rank: u32, fill: InitialFill) {
        self.set_rank_memory(side, rank, RankMemory::Untouched(fill));
    }

    fn set_rank_memory(&mut self, side: Side, rank: u32, memory: RankMemory) {
        let slots = match side {
            Side::Decode => &mut self.decode_memory,
            Side::Prefill => &mut self.prefill_memory,
        };
        if let Some(slot) = slots.get_mut(rank as usize) {
            *slot = Some(memory);
        }
    }

    /// Drops every rank's memory, as a trace recorded without memory has none.
    #[cfg(test)]
    pub(crate) fn forget_memory(&mut self) {
        for slot in self
            .decode_memory
            .iter_mut()
            .chain(&mut self.prefill_memory)
        {
            *slot = None;
        }
    }

    /// The memory the case carries of one rank (byte-level oracles only).
    pub fn rank_memory(&self, side: Side, rank: u32) -> Option<&RankMemory> {
        let slots = match side {
            Side::Decode => &self.decode_memory,
            Side::Prefill => &self.prefill_memory,
        };
        slots.get(rank as usize).and_then(Option::as_ref)
    }

    /// The region images of one rank, if the case carries them (not for a
    /// rank nothing touched).
    pub fn memory(&self, side: Side, rank: u32) -> Option<&MemoryImages> {
        match self.rank_memory(side, rank)? {
            RankMemory::Images(images) => Some(images),
            RankMemory::Untouched(_) => None,
        }
    }

    /// The case's geometry.
    pub fn geometry(&self) -> &Geometry {
        self.case.geometry()
    }

    /// Pull or push.
    pub fn mode(&self) -> Mode {
        self.case.mode()
    }

    /// Pairs of posted transfers: the ones that moved bytes.
    pub fn posted_pairs(&self) -> impl Iterator<Item = &OraclePair> {
        self.pairs.iter().filter(|p| p.posted)
    }
}
