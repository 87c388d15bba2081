//! `--connector vllm`: running vLLM's own NIXL connector through the Python
//! driver in `vllm-driver/` over the same cases as the sweep (the memory
//! kvgeom prepares, the driver processes, their files); `under_test::vllm`
//! turns each case into a run record for the judge.

pub(crate) mod batch;
pub(crate) mod blocks;
pub(crate) mod chunks;
pub(crate) mod covered_range;
pub(crate) mod error;
pub(crate) mod nixl;
pub(crate) mod place;
pub(crate) mod post_process_calls;
pub(crate) mod process;
pub(crate) mod protocol;
pub(crate) mod python;
pub(crate) mod run;
pub(crate) mod shrink;
pub(crate) mod traces;

pub use batch::{run_in_scratch, DriverSettings};
pub use blocks::{BlockCheck, BlocksComparison, EngineBlocks, PairBlocks};
pub use chunks::{default_drivers, CHUNK_MEMORY_BYTES, MAX_DEFAULT_DRIVERS};
pub use covered_range::CoveredRange;
pub use error::BatchError;
pub use nixl::{NixlChoice, NixlRun, NixlUnavailable};
pub use place::{
    RequestPath, Requests, SchedulerComparison, SchedulerInfo, SchedulerPlaced, NOT_REACHABLE,
};
pub use process::ProcessError;
pub use python::{find, Checkout, FindError, Interpreter, Provenance, INSTALL_SCRIPT};
pub use run::{DriverCase, Hooks, JudgeDriverCase, Prepared, CASE_LIMIT};
pub use shrink::live_replay_command;
pub use traces::{trace_file_name, TRACE_MEMORY_LIMIT};
