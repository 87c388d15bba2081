//! `--connector vllm`: running vLLM's own NIXL connector through the Python
//! driver in `vllm-driver/` over the same cases as the sweep (the memory
//! kvgeom prepares, the driver processes, their files); `under_test::vllm`
//! turns each case into a run record for the judge.

pub mod batch;
pub mod blocks;
pub mod chunks;
pub mod error;
pub mod nixl;
pub(crate) mod post_process_calls;
pub mod process;
pub mod protocol;
pub mod python;
pub mod run;
pub mod shrink;
pub mod traces;

pub use batch::run_in_scratch;
pub use blocks::{BlockCheck, BlocksComparison, EngineBlocks, PairBlocks};
pub use chunks::{default_drivers, CHUNK_MEMORY_BYTES, MAX_DEFAULT_DRIVERS};
pub use error::BatchError;
pub use nixl::{NixlChoice, NixlRun, NixlUnavailable};
pub use process::ProcessError;
pub use python::{find, FindError, Interpreter, INSTALL_SCRIPT};
pub use run::{DriverCase, Hooks, JudgeDriverCase, Prepared, CASE_LIMIT};
pub use shrink::live_replay_command;
pub use traces::{trace_file_name, TRACE_MEMORY_LIMIT};
