//! Why kvgeom cannot model an SGLang case or cannot judge what the driver
//! left (a missing interpreter is `python::PythonError`).

use std::path::PathBuf;

use crate::layout::Side;

/// Why kvgeom's model of SGLang's pools cannot hold a case.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    /// The geometry has no `model.attention`.
    #[error("an SGLang geometry needs model.attention")]
    NoAttention,
    /// Attention TP, page size or layers is zero.
    #[error("attention TP, page size and layers must be positive")]
    NotPositive,
    /// The attention TP does not shard the KV heads.
    #[error("{side} attention TP {tp} neither divides nor is a multiple of {heads} KV heads")]
    HeadsSplit {
        /// The engine.
        side: Side,
        /// Its attention TP.
        tp: u32,
        /// The total KV heads.
        heads: u32,
    },
    /// An engine's pool is smaller than the request.
    #[error("{side}.num_pages {num_pages}: the request needs {needed} pages")]
    TooFewPages {
        /// The engine.
        side: Side,
        /// Its pool's pages.
        num_pages: u32,
        /// The request's pages.
        needed: u32,
    },
    /// The driver runs no element of this size.
    #[error("dtype_bytes {bytes}: the SGLang driver runs 1, 2 or 4 byte elements")]
    Dtype {
        /// `dtype_bytes`.
        bytes: u32,
    },
}

/// Why a case the driver ran cannot be judged (the case is an error).
#[derive(Debug, thiserror::Error)]
pub enum JudgeError {
    /// A rank's registered regions differ from kvgeom's model.
    #[error("kvgeom's model of SGLang's pools disagrees with SGLang's: {0}")]
    Layout(String),
    /// The driver's result names no agent for a rank.
    #[error("the SGLang driver reports no agent {agent}")]
    NoAgent {
        /// The agent, `side-rank`.
        agent: String,
    },
    /// A memory image could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The image.
        path: PathBuf,
        /// What the file system answered.
        #[source]
        source: std::io::Error,
    },
    /// A memory image has another length than its region or tensor.
    #[error("{}: {found} bytes, the {what} has {expected}", path.display())]
    Length {
        /// The image.
        path: PathBuf,
        /// Its bytes.
        found: usize,
        /// `region` or `state tensor`.
        what: &'static str,
        /// The bytes of the region or tensor.
        expected: u64,
    },
    /// A recorded trace holds no final image of a region or tensor.
    #[error("the trace holds no final image of {agent} {what}")]
    NoImage {
        /// The agent, `side-rank`.
        agent: String,
        /// `region N` or `state tensor N`.
        what: String,
    },
    /// A rank has another number of state regions than kvgeom's model.
    #[error("{agent}: SGLang has {found} state regions, kvgeom's model {model}")]
    StateCount {
        /// The agent, `side-rank`.
        agent: String,
        /// SGLang's state regions.
        found: usize,
        /// kvgeom's.
        model: usize,
    },
    /// A state region differs from kvgeom's model.
    #[error(
        "{agent} state region {index}: SGLang (what, len, item_len, dim, outer_count, \
         conv_shard_groups) = {theirs}, kvgeom's model {mine}"
    )]
    StateRegion {
        /// The agent, `side-rank`.
        agent: String,
        /// The region's index.
        index: u32,
        /// SGLang's fields, as a tuple.
        theirs: String,
        /// kvgeom's, as a tuple.
        mine: String,
    },
}
