//! The connector: the specification's worked examples, fuzz regressions,
//! properties over generated cases, the oracles, the defect table, list
//! memory types, the loopback transport, touched ranks, fidelity to vLLM
//! 0.33.0's recorded transfers and vLLM 0.34.0's decisions on shipped
//! geometries.

#[path = "../support/mod.rs"]
mod support;

mod defects;
mod memory_types;
mod oracles;
mod planning_examples;
mod properties;
mod regressions;
mod release_decisions;
mod touched_ranks;
mod transport_loopback;
mod vllm_fidelity;
