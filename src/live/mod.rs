//! `--connector vllm`: vLLM's own NIXL connector, driven by the Python
//! driver in `vllm-driver/` over the same cases as the sweep, judged by
//! kvgeom's oracles on vLLM's real final memory.

pub mod blocks;
pub mod process;
pub mod protocol;
pub mod python;
pub mod run;
pub mod shrink;
pub mod traces;

pub use blocks::{BlockCheck, BlocksComparison, EngineBlocks, PairBlocks};
pub use process::ProcessError;
pub use python::{find, FindError, Interpreter, INSTALL_SCRIPT, PINNED_VLLM};
pub use run::{
    run_batch, run_batch_checked, run_batch_hooked, run_batch_with, run_sweep, run_sweep_recording,
    BatchError, Hooks, LiveReport, PlanComparison, CASE_LIMIT, CHUNK_MEMORY_BYTES,
};
pub use shrink::{live_replay_command, shrink_live};
pub use traces::{trace_file_name, TRACE_MEMORY_LIMIT};
