//! Why a layout or a request description cannot be built.

use super::Side;

/// A geometry, rank or request that the memory model cannot describe.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    #[error("the model has no attention spec, so the unified page size is undefined")]
    NoAttention,
    #[error("the attention spec has zero bytes per head per token")]
    EmptyHead,
    #[error("{side} tp_size is 0")]
    ZeroTpSize { side: Side },
    #[error("{side} tp_rank {rank} is not below tp_size {tp_size}")]
    RankOutOfRange { side: Side, rank: u32, tp_size: u32 },
    #[error("{side} kernel block {kernel} tokens does not divide logical block {logical} tokens (both must be non-zero)")]
    KernelBlock {
        side: Side,
        kernel: u32,
        logical: u32,
    },
    #[error(
        "{total_heads} KV heads cannot be spread over TP {tp_size} (neither divides the other)"
    )]
    HeadSharding { total_heads: u32, tp_size: u32 },
    #[error("{side} has {got} region bases but the model has {expected} layer slots")]
    RegionCount {
        side: Side,
        got: usize,
        expected: u32,
    },
    #[error("{side} regions {first} and {second} overlap")]
    RegionOverlap { side: Side, first: u32, second: u32 },
    #[error("the model has mamba groups but no mamba spec")]
    MissingMambaSpec,
    #[error("{side} has no logical blocks")]
    NoBlocks { side: Side },
    #[error("{side} mamba state of {state} bytes does not fit the unified page of {page} bytes")]
    MambaTooLarge { side: Side, state: u64, page: u64 },
    #[error("{side} page view of {unit_tokens}-token units does not divide the {kernel}-token kernel block")]
    PageView {
        side: Side,
        unit_tokens: u32,
        kernel: u32,
    },
    #[error("{side} request lists {got} groups but the model has {expected}")]
    GroupCount {
        side: Side,
        got: usize,
        expected: usize,
    },
    #[error("{side} block {block} is listed twice in the request (groups {first} and {second})")]
    DuplicateBlock {
        side: Side,
        block: u32,
        first: usize,
        second: usize,
    },
    #[error("{side} block {block} of group {group} is beyond the pool of {pool} logical blocks")]
    BlockOutOfPool {
        side: Side,
        block: u32,
        group: usize,
        pool: u32,
    },
    #[error(
        "decode transfer block {block} of group {group} is not one of the request's decode blocks"
    )]
    TransferBlockNotOwned { block: u32, group: usize },
    #[error("{side} has {got} ranks but tp_size is {expected}")]
    RankCount {
        side: Side,
        got: usize,
        expected: u32,
    },
}
