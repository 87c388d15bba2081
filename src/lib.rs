//! kvgeom: a verification harness and descriptor-geometry fuzzer for KV-cache
//! transfers over NVIDIA NIXL.
//!
//! The [`connector`] is a Rust implementation of vLLM 0.33.0's NIXL KV
//! connector for hybrid (attention + mamba) models with heterogeneous P/D
//! block geometry. It talks to NIXL only through the [`nixl::Nixl`] trait;
//! the [`nixl::Recording`] wrapper resolves every descriptor to byte ranges
//! and the oracles check them against the memory the scenario allocated.

pub mod bench;
pub mod cli;
pub mod connector;
pub mod defects;
#[cfg(feature = "arbitrary")]
pub mod generate;
pub mod geometry;
pub mod layout;
pub mod live;
pub mod memory;
pub mod nixl;
pub mod oracle;
pub mod pattern;
pub mod report;
pub mod scenario;
pub mod scheduler;
pub mod sweep;
pub mod trace;
pub mod variant;
