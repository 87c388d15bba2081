//! What a descriptor row touches: the result of classifying a byte range
//! against the memory model and the request's block lists.

use std::ops::Range;

use serde::{Deserialize, Serialize};

use super::Side;

/// Order in which a rectangle's bytes walk its (token, head) cells.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CellOrder {
    /// Tokens outer, heads inner (also used when the span has one token or one head).
    TokenMajor,
    /// Heads outer, tokens inner.
    HeadMajor,
}

/// Whether an attention byte range is an exact product of token, head and
/// content ranges, walked in one [`CellOrder`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SpanShape {
    /// An exact product of token, head and content ranges.
    Rect,
    /// Not a rectangle (e.g. starts or ends inside a head's content while
    /// spanning several cells); the ranges below only bound it.
    Ragged,
}

/// An attention byte range of one of the request's blocks.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AttentionSpan {
    /// KV-cache group index.
    pub group: u32,
    /// Position of the logical block in the request's list for this group.
    pub block_position: u32,
    /// Request-relative tokens.
    pub tokens: Range<u32>,
    /// Global KV heads.
    pub heads: Range<u32>,
    /// Bytes inside each head's content.
    pub content: Range<u64>,
    /// The order the cells are walked in.
    pub order: CellOrder,
    /// Whether the range is an exact product of its token, head and content ranges.
    pub shape: SpanShape,
}

/// A sub-region of a mamba state page.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MambaPart {
    /// Conv sub-projection `j`.
    Conv(u32),
    /// The temporal (SSM) state.
    Ssm,
    /// Bytes after the state, up to the page size (never a coordinate).
    Padding,
}

impl std::fmt::Display for MambaPart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MambaPart::Conv(j) => write!(f, "conv{j}"),
            MambaPart::Ssm => f.write_str("ssm"),
            MambaPart::Padding => f.write_str("padding"),
        }
    }
}

/// The part of a mamba byte range that lies in one sub-region.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MambaPiece {
    /// The sub-region.
    pub part: MambaPart,
    /// Bytes of the full (all-rank) sub-region state; for padding, page offsets.
    pub global: Range<u64>,
}

impl std::fmt::Display for MambaPiece {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}[{}, {})",
            self.part, self.global.start, self.global.end
        )
    }
}

/// A mamba byte range of one of the request's state slots.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MambaSpan {
    /// The mamba group.
    pub group: u32,
    /// Position of the slot in the request's list for this group.
    pub slot_position: u32,
    /// The sub-regions touched, in address order.
    pub pieces: Vec<MambaPiece>,
}

impl MambaSpan {
    /// Whether any byte lies in the page's padding.
    pub fn touches_padding(&self) -> bool {
        self.pieces.iter().any(|p| p.part == MambaPart::Padding)
    }
}

/// What a byte range holds.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LocationKind {
    /// Bytes of the request's attention blocks.
    Attention(AttentionSpan),
    /// Bytes of the request's mamba state slots.
    Mamba(MambaSpan),
    /// Inside one logical block that is not one of the request's blocks.
    Unowned,
    /// Inside a region but across a logical block boundary.
    CrossesBlocks,
    /// In the padding between the kernel pages of an attention block
    /// (layouts whose kernel block stride exceeds the page).
    PagePadding,
    /// Not inside any region of this rank (or running past a region's end).
    OutsideRegions,
    /// The agent name is not `prefill-<rank>`/`decode-<rank>` of this case.
    UnknownAgent,
}

impl LocationKind {
    /// Short name used in messages.
    pub fn name(&self) -> &'static str {
        match self {
            LocationKind::Attention(_) => "attention",
            LocationKind::Mamba(_) => "mamba",
            LocationKind::Unowned => "unowned block",
            LocationKind::CrossesBlocks => "across blocks",
            LocationKind::PagePadding => "page padding",
            LocationKind::OutsideRegions => "outside regions",
            LocationKind::UnknownAgent => "unknown agent",
        }
    }
}

/// A classified descriptor row.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Location {
    /// Engine and rank of the agent, when the agent name is known.
    pub side: Option<Side>,
    /// The agent's TP rank, when known.
    pub rank: Option<u32>,
    /// The region holding the first byte, if any.
    pub region: Option<u32>,
    /// Offset from the region base (the raw address when outside every region).
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
    /// Logical block of the first byte.
    pub logical_block: Option<u32>,
    /// What the bytes hold.
    pub kind: LocationKind,
}

impl Location {
    /// The attention span, if the row holds attention bytes.
    pub fn attention(&self) -> Option<&AttentionSpan> {
        match &self.kind {
            LocationKind::Attention(a) => Some(a),
            _ => None,
        }
    }

    /// The mamba span, if the row holds mamba state.
    pub fn mamba(&self) -> Option<&MambaSpan> {
        match &self.kind {
            LocationKind::Mamba(m) => Some(m),
            _ => None,
        }
    }

    /// Region-relative byte range.
    pub fn byte_range(&self) -> Range<u64> {
        self.offset..self.offset + self.len
    }
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.side, self.rank) {
            (Some(side), Some(rank)) => write!(f, "{side}-{rank}")?,
            _ => f.write_str("?")?,
        }
        if let Some(region) = self.region {
            write!(f, " region {region}")?;
        }
        write!(f, " [{:#x}, +{})", self.offset, self.len)?;
        if let Some(b) = self.logical_block {
            write!(f, " block {b}")?;
        }
        match &self.kind {
            LocationKind::Attention(a) => write!(
                f,
                " attention g{} tokens {:?} heads {:?} content {:?} {:?}{}",
                a.group,
                a.tokens,
                a.heads,
                a.content,
                a.order,
                if a.shape == SpanShape::Ragged {
                    " ragged"
                } else {
                    ""
                }
            ),
            LocationKind::Mamba(m) => {
                write!(f, " mamba g{} slot#{}", m.group, m.slot_position)?;
                for p in &m.pieces {
                    write!(f, " {p}")?;
                }
                Ok(())
            }
            other => write!(f, " {}", other.name()),
        }
    }
}
