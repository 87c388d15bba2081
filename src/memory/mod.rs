//! KV backing memory: host arenas now, CUDA arenas behind the `cuda` feature.

pub mod host;

pub use host::HostArena;
