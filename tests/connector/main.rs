//! The connector: the specification's worked examples, fuzz regressions,
//! properties over generated cases, the oracles, the defect table, list
//! memory types, the loopback transport, touched ranks and fidelity to
//! vLLM 0.33.0's recorded transfers.

#[path = "../support/mod.rs"]
mod support;

mod defects;
mod memory_types;
mod oracles;
mod planning_examples;
mod properties;
mod regressions;
mod touched_ranks;
mod transport_loopback;
mod vllm_fidelity;
