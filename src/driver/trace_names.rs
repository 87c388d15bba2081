//! The names of recorded traces, for every stack's driver: a case's trace
//! file is named by its geometry, mode, prompt, prefix hit, allocation and
//! seed, and a trace embeds memory images up to one limit.

use crate::scenario::Case;

/// A recorded trace embeds the memory images of a case whose initial
/// memory (every region of every rank) holds at most this many bytes.
pub const TRACE_MEMORY_LIMIT: u64 = 1 << 20;

/// The name a saved trace gets: geometry, mode, prompt, prefix hit,
/// allocation and seed.
pub fn trace_file_name(case: &Case) -> String {
    format!(
        "{}-{}-n{}-hit{}-{}-s{}.trace.json",
        case.geometry_name(),
        case.mode,
        case.prompt_len,
        case.prefix_hit,
        case.allocation.as_str(),
        case.seed
    )
}

/// The name decode rank `rank`'s v1 trace of a case gets: the v2 name's
/// stem, the rank, `.jsonl`.
pub fn v1_trace_file_name(case: &Case, rank: u32) -> String {
    let v2 = trace_file_name(case);
    let stem = v2.strip_suffix(".trace.json").unwrap_or(&v2);
    format!("{stem}-d{rank}.jsonl")
}
