//! Why a live batch cannot run through vLLM's connector at all (the caller
//! exits 2).

use std::path::PathBuf;

use crate::driver::{DriverError, ProcessError};

/// Why a batch could not run through vLLM's connector at all (the caller
/// exits 2).
#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    /// A scratch folder could not be created.
    #[error("cannot create {}: {source}", path.display())]
    CreateDir {
        /// The folder.
        path: PathBuf,
        /// What the file system answered.
        #[source]
        source: std::io::Error,
    },
    /// An input file of the driver could not be written.
    #[error("cannot write {}: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// What the file system answered.
        #[source]
        source: std::io::Error,
    },
    /// The batch could not be written as JSON.
    #[error(transparent)]
    Encode(serde_json::Error),
    /// Every driver process stopped before the batch was handed out (one
    /// of them failed; its error is reported instead where known).
    #[error("the driver processes stopped before every chunk of the batch ran")]
    LanesStopped,
    /// The driver could not run the batch (exit 2): missing, not
    /// started, short of memory, another vLLM's API, real NIXL
    /// unavailable, or a failure status.
    #[error(transparent)]
    Driver(#[from] DriverError),
}

impl From<ProcessError> for BatchError {
    fn from(e: ProcessError) -> Self {
        BatchError::Driver(DriverError::Process(e))
    }
}
