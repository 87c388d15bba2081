//! Benchmarks behind `kvgeom bench`: each measures one path and returns a
//! report that prints as a table.

pub mod transport;

pub use transport::{
    transport_bench, BenchError, PathResult, TransportBenchConfig, TransportBenchReport,
};
