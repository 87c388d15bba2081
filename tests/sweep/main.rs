//! Sweeps and their inputs and outputs: the default sweep, the expectations
//! file, layout snapshots, geometry files, sharded reports merged, and the
//! memory estimate.

#[path = "../support/mod.rs"]
mod support;

mod default_sweep;
mod expectations;
mod geometry_files;
mod memory_estimate;
mod report_merge;
mod snapshots;
mod sweep_default;
