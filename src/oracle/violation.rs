//! One broken invariant, with enough detail to find the bytes and the pair.

use std::ops::Range;

use serde::Serialize;

use crate::layout::Side;

/// A transfer pair by position: transfer index in recording order, pair index inside it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct PairRef {
    /// Transfer index, in recording order.
    pub xfer: usize,
    /// Pair index inside the transfer.
    pub pair: usize,
}

impl std::fmt::Display for PairRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "xfer {} pair {}", self.xfer, self.pair)
    }
}

/// A broken invariant. Byte ranges are offsets from the region base.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Violation {
    /// The oracle that found it ([`crate::oracle::Oracle::name`]).
    pub oracle: &'static str,
    /// The engine holding the offending bytes, when known.
    pub side: Option<Side>,
    /// Its TP rank, when known.
    pub rank: Option<u32>,
    /// The region (layer slot), when known.
    pub region: Option<u32>,
    /// The engine's logical block holding the first offending byte.
    pub local_block: Option<u32>,
    /// Region-relative range from the first to the last offending byte.
    pub byte_range: Option<Range<u64>>,
    /// How many bytes (or cells, as the message says) are wrong.
    pub bytes: u64,
    /// What the bytes should hold, in words (e.g. `0x00 or prefill's 0x37`).
    pub expected: Option<String>,
    /// What they hold.
    pub found: Option<String>,
    /// The pairs involved.
    pub pairs: Vec<PairRef>,
    /// The full description, as reports print it.
    pub message: String,
}

impl Violation {
    /// A violation of `oracle` with only a message; the builders below add the rest.
    pub fn new(oracle: &'static str, message: impl Into<String>) -> Self {
        Self {
            oracle,
            side: None,
            rank: None,
            region: None,
            local_block: None,
            byte_range: None,
            bytes: 0,
            expected: None,
            found: None,
            pairs: Vec::new(),
            message: message.into(),
        }
    }

    /// The engine and rank of the offending bytes.
    pub fn on(mut self, side: Option<Side>, rank: Option<u32>) -> Self {
        self.side = side;
        self.rank = rank;
        self
    }

    /// The region of the offending bytes.
    pub fn region(mut self, region: Option<u32>) -> Self {
        self.region = region;
        self
    }

    /// The engine's logical block holding the first offending byte.
    pub fn block(mut self, block: Option<u32>) -> Self {
        self.local_block = block;
        self
    }

    /// The region-relative byte range and the count of wrong bytes in it.
    pub fn bytes(mut self, range: Range<u64>, count: u64) -> Self {
        self.byte_range = Some(range);
        self.bytes = count;
        self
    }

    /// What the bytes should hold.
    pub fn expected(mut self, expected: impl Into<String>) -> Self {
        self.expected = Some(expected.into());
        self
    }

    /// What they hold.
    pub fn found(mut self, found: impl Into<String>) -> Self {
        self.found = Some(found.into());
        self
    }

    /// Add a pair involved.
    pub fn pair(mut self, pair: PairRef) -> Self {
        self.pairs.push(pair);
        self
    }
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "[{}]", self.oracle)?;
        if let (Some(side), Some(rank)) = (self.side, self.rank) {
            write!(f, " {side}-{rank}")?;
        }
        if let Some(r) = self.region {
            write!(f, " region {r}")?;
        }
        if let Some(b) = self.local_block {
            write!(f, " block {b}")?;
        }
        if let Some(range) = &self.byte_range {
            write!(
                f,
                " bytes [{:#x}, {:#x}) ({})",
                range.start, range.end, self.bytes
            )?;
        }
        for p in &self.pairs {
            write!(f, " ({p})")?;
        }
        write!(f, ": {}", self.message)?;
        if let Some(e) = &self.expected {
            write!(f, "; expected {e}")?;
        }
        if let Some(x) = &self.found {
            write!(f, "; found {x}")?;
        }
        Ok(())
    }
}
