//! In-process transport over host arenas (placeholder until implemented).

/// Several agents in one process moving bytes between registered host memory.
#[derive(Debug, Default)]
pub struct Loopback;
