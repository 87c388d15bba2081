//! TP-independent coordinates of KV bytes: the identity a byte keeps when it
//! moves from a prefill rank to a decode rank.

use serde::{Deserialize, Serialize};

use super::location::MambaPart;

/// Where a byte of a request's KV belongs in the model, independent of the
/// engine, TP rank, block ids and page layout that hold it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Coordinate {
    /// One byte of one head of one token of an attention group.
    Attention {
        /// The region (layer slot).
        region: u32,
        /// The attention group.
        group: u32,
        /// Request-relative token index.
        token: u32,
        /// Global KV head (0 for MLA).
        head: u32,
        /// Byte inside the head's content (K then V; the latent for MLA).
        byte: u64,
    },
    /// One byte of one mamba group's state, as a byte of the full (all-rank) state.
    Mamba {
        /// The region (layer slot).
        region: u32,
        /// The mamba group.
        group: u32,
        /// The sub-region (conv projection or SSM state).
        part: MambaPart,
        /// Byte of the full sub-region state summed over all TP ranks.
        byte: u64,
    },
}
