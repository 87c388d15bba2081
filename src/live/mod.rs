//! `--connector vllm`: running vLLM's own NIXL connector through the Python
//! driver in `vllm-driver/` over the same cases as the sweep (the memory
//! kvgeom prepares, the driver processes, their files), as a connector
//! under test ([`VllmConnector`], `connector.rs`): each driver result
//! converted into `under_test`'s neutral run record (`driver_log.rs`, its
//! transfers resolved onto kvgeom's layout in `pairs.rs`) for the one
//! judge.

pub(crate) mod batch;
pub(crate) mod blocks;
pub(crate) mod chunks;
pub(crate) mod connector;
pub(crate) mod driver_log;
pub(crate) mod error;
pub(crate) mod limits;
pub(crate) mod pairs;
pub(crate) mod place;
pub(crate) mod protocol;
pub(crate) mod python;
pub(crate) mod run;
pub(crate) mod shrink;
pub(crate) mod traces;

pub use crate::under_test::CoveredRange;
pub use batch::{run_in_scratch, DriverSettings};
pub use blocks::{BlockCheck, BlocksComparison, EngineBlocks, PairBlocks};
pub use chunks::{
    default_drivers, drivers_for, CASES_PER_DEFAULT_DRIVER, CHUNK_MEMORY_BYTES, MAX_DEFAULT_DRIVERS,
};
pub use connector::{
    run_batch, run_batch_checked, run_batch_hooked, run_batch_with, run_sweep, run_sweep_probed,
    run_sweep_requests, DefectProbe, LiveReport, ProbeSeen, VllmConnector, VllmRecord,
};
pub use driver_log::{connector_log, run_outcome};
pub use error::BatchError;
pub use place::{
    RequestPath, Requests, SchedulerComparison, SchedulerInfo, SchedulerPlaced, NOT_REACHABLE,
};
pub use python::{find, Checkout, FindError, Interpreter, Provenance, INSTALL_SCRIPT, VLLM_DRIVER};
pub use run::{DriverCase, Hooks, JudgeDriverCase, Prepared, CASE_LIMIT};
pub use shrink::live_replay_command;
