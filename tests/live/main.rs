//! `--connector vllm`: vLLM's own connector under kvgeom's oracles (needs
//! the project's vLLM venv for most tests; each says why it is skipped
//! without one), and the Python tests of both drivers (SGLang's need its
//! venv).

#[path = "../support/mod.rs"]
mod support;

mod api_check_fields;
mod conformance;
mod driver_python_tests;
mod live_sglang;
mod live_vllm;
mod plan_differences;
mod provenance;
mod scheduler_requests;
mod sglang_driver_tests;
mod sglang_gdn_history;
mod sglang_history;
mod sglang_real_nixl;
mod sglang_traces;
mod vllm_branch;
