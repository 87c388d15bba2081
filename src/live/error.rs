//! Why a live batch cannot run through vLLM's connector at all (the caller
//! exits 2).

use std::path::PathBuf;

use super::process::ProcessError;

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
    /// `vllm-driver/driver.py` is not where it should be.
    #[error("the driver is missing: {}", script.display())]
    DriverMissing {
        /// Where the driver was looked for.
        script: PathBuf,
    },
    /// The driver's interpreter could not be run.
    #[error(transparent)]
    Process(#[from] ProcessError),
    /// The interpreter's vLLM lacks classes or methods the driver drives
    /// (another vLLM than the pinned one: a branch or a pull request).
    #[error(
        "vLLM {vllm_version} ({}) lacks what the driver needs:\n  - {}",
        python.display(),
        missing.join("\n  - ")
    )]
    MissingApi {
        /// The interpreter that ran the driver.
        python: PathBuf,
        /// Its vLLM's version.
        vllm_version: String,
        /// Each missing name, with what the driver uses it for.
        missing: Vec<String>,
    },
    /// Real NIXL was asked for and does not run in the driver's interpreter.
    #[error(
        "--nixl real: the vLLM driver ({}) cannot run real NIXL: {message}; {}",
        python.display(),
        super::nixl::INSTALL_HINT
    )]
    NixlUnavailable {
        /// The interpreter that ran the driver.
        python: PathBuf,
        /// What the driver said.
        message: String,
    },
    /// The driver ended with a failure status before its time-out.
    #[error(
        "the vLLM driver ({}) failed with status {status:?}:\n{stderr_tail}",
        python.display()
    )]
    DriverFailed {
        /// The interpreter that ran it.
        python: PathBuf,
        /// Its exit status (`None`: killed by a signal).
        status: Option<i32>,
        /// The last lines it wrote to stderr.
        stderr_tail: String,
    },
}
