//! The room every stack's Python driver shares (`live` for vLLM's,
//! `sglang` for SGLang's): a driver process run within a time limit
//! ([`process`]), its ending classified once ([`exit`]: the interpreter
//! short of memory, the API-drift exit, real NIXL unavailable, any other
//! failure as the one [`DriverError`]), scratch folders ([`scratch`]), the
//! NIXL that moves the bytes ([`nixl`]), the names of recorded traces
//! ([`trace_names`]) and where the drivers are ([`root`]). It knows no
//! stack's protocol: each stack names itself with a [`DriverKind`].

pub(crate) mod exit;
pub(crate) mod nixl;
pub(crate) mod process;
pub(crate) mod root;
pub(crate) mod scratch;
pub(crate) mod trace_names;

pub use exit::{
    address_space_limit, memory_failure, run_driver, DriverError, DriverKind, DriverRun,
    API_DRIFT_STATUS, UNAVAILABLE_STATUS,
};
pub use nixl::{resolve, NixlChoice, NixlRun, NixlUnavailable, Resolved};
pub use process::{run_bounded, Finished, ProcessError};
pub use root::project_root;
pub use scratch::{fresh_scratch, remove_unless_kept, scratch_for};
pub use trace_names::{trace_file_name, v1_trace_file_name, TRACE_MEMORY_LIMIT};
