//! `--connector vllm`: vLLM's own NIXL connector, driven by the Python
//! driver in `vllm-driver/` over the same cases as the sweep, judged by
//! kvgeom's oracles on vLLM's real final memory.

pub(crate) mod batch;
pub(crate) mod blocks;
pub(crate) mod chunks;
pub(crate) mod error;
pub(crate) mod nixl;
pub(crate) mod post_process_calls;
pub(crate) mod process;
pub(crate) mod protocol;
pub(crate) mod python;
pub(crate) mod run;
pub(crate) mod shrink;
pub(crate) mod traces;

pub use batch::{
    run_batch, run_batch_checked, run_batch_hooked, run_batch_with, run_sweep, run_sweep_recording,
};
pub use blocks::{BlockCheck, BlocksComparison, EngineBlocks, PairBlocks};
pub use chunks::{default_drivers, CHUNK_MEMORY_BYTES, MAX_DEFAULT_DRIVERS};
pub use error::BatchError;
pub use nixl::{NixlChoice, NixlRun, NixlUnavailable};
pub use process::ProcessError;
pub use python::{find, FindError, Interpreter, INSTALL_SCRIPT, PINNED_VLLM};
pub use run::{Hooks, LiveReport, PlanComparison, CASE_LIMIT};
pub use shrink::{live_replay_command, shrink_live};
pub use traces::{trace_file_name, TRACE_MEMORY_LIMIT};
