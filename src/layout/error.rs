//! Why a layout or a request description cannot be built.

use super::Side;

/// A geometry, rank or request that the memory model cannot describe.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    /// No attention spec: the unified page has no size.
    #[error("the model has no attention spec, so the unified page size is undefined")]
    NoAttention,
    /// The attention spec has zero bytes per head per token.
    #[error("the attention spec has zero bytes per head per token")]
    EmptyHead,
    /// An engine with no ranks.
    #[error("{side} tp_size is 0")]
    ZeroTpSize {
        /// The engine.
        side: Side,
    },
    /// A rank past the engine's TP size.
    #[error("{side} tp_rank {rank} is not below tp_size {tp_size}")]
    RankOutOfRange {
        /// The engine.
        side: Side,
        /// The rank asked for.
        rank: u32,
        /// The engine's TP size.
        tp_size: u32,
    },
    /// A logical block that is not a whole number of kernel blocks.
    #[error("{side} kernel block {kernel} tokens does not divide logical block {logical} tokens (both must be non-zero)")]
    KernelBlock {
        /// The engine.
        side: Side,
        /// Kernel block size, in tokens.
        kernel: u32,
        /// Logical block size, in tokens.
        logical: u32,
    },
    /// KV heads that neither shard nor replicate evenly over TP.
    #[error(
        "{total_heads} KV heads cannot be spread over TP {tp_size} (neither divides the other)"
    )]
    HeadSharding {
        /// The model's KV heads.
        total_heads: u32,
        /// The engine's TP size.
        tp_size: u32,
    },
    /// A rank with a different number of region bases than layer slots.
    #[error("{side} has {got} region bases but the model has {expected} layer slots")]
    RegionCount {
        /// The engine.
        side: Side,
        /// Region bases given.
        got: usize,
        /// The model's layer slots.
        expected: u32,
    },
    /// Two regions of one rank share bytes.
    #[error("{side} regions {first} and {second} overlap")]
    RegionOverlap {
        /// The engine.
        side: Side,
        /// One region.
        first: u32,
        /// The region it overlaps.
        second: u32,
    },
    /// Mamba groups without a mamba spec.
    #[error("the model has mamba groups but no mamba spec")]
    MissingMambaSpec,
    /// An engine with an empty block pool.
    #[error("{side} has no logical blocks")]
    NoBlocks {
        /// The engine.
        side: Side,
    },
    /// One rank's mamba state is larger than the unified page.
    #[error("{side} mamba state of {state} bytes does not fit the unified page of {page} bytes")]
    MambaTooLarge {
        /// The engine.
        side: Side,
        /// Conv plus SSM state of one rank, in bytes.
        state: u64,
        /// The unified page, in bytes.
        page: u64,
    },
    /// A page view whose unit does not tile the kernel block.
    #[error("{side} page view of {unit_tokens}-token units does not divide the {kernel}-token kernel block")]
    PageView {
        /// The engine.
        side: Side,
        /// Tokens per unit of the view.
        unit_tokens: u32,
        /// Kernel block size, in tokens.
        kernel: u32,
    },
    /// A request whose block lists do not match the model's groups.
    #[error("{side} request lists {got} groups but the model has {expected}")]
    GroupCount {
        /// The engine.
        side: Side,
        /// Block lists given.
        got: usize,
        /// The model's groups.
        expected: usize,
    },
    /// One logical block in two places of a request.
    #[error("{side} block {block} is listed twice in the request (groups {first} and {second})")]
    DuplicateBlock {
        /// The engine.
        side: Side,
        /// The logical block id.
        block: u32,
        /// The first group listing it.
        first: usize,
        /// The second group listing it.
        second: usize,
    },
    /// A block id past the pool.
    #[error("{side} block {block} of group {group} is beyond the pool of {pool} logical blocks")]
    BlockOutOfPool {
        /// The engine.
        side: Side,
        /// The logical block id.
        block: u32,
        /// The group listing it.
        group: usize,
        /// Logical blocks in the pool.
        pool: u32,
    },
    /// A block the transfer fills that the request does not hold.
    #[error(
        "decode transfer block {block} of group {group} is not one of the request's decode blocks"
    )]
    TransferBlockNotOwned {
        /// D's logical block id.
        block: u32,
        /// The group listing it.
        group: usize,
    },
    /// A different number of rank layouts than the TP size.
    #[error("{side} has {got} ranks but tp_size is {expected}")]
    RankCount {
        /// The engine.
        side: Side,
        /// Ranks given.
        got: usize,
        /// The engine's TP size.
        expected: u32,
    },
}
