//! Benchmarks behind `kvgeom bench`: each measures one path and returns a
//! report that prints as a table. `transport` moves host bytes; `vram`
//! replays one connector request's transfers on device (or host) memory
//! through copies, the loopback transport and real NIXL, optionally with
//! the prefill side in a `peer` process; `scale` runs real-scale cases
//! against this machine's memcpy and memory.

pub mod buffers;
#[cfg(feature = "nixl")]
pub mod peer;
pub mod replay;
pub mod request_plan;
pub mod scale;
pub mod transport;
pub mod vram;

pub use transport::{
    transport_bench, BenchError, PathResult, TransportBenchConfig, TransportBenchReport,
};
