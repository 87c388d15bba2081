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
    /// The driver could not start (or ran out) within this process's memory
    /// limits: Python or its libraries could not map or allocate memory
    /// (an address-space limit set with `ulimit -v`, no memory left).
    #[error(
        "the vLLM driver ({}) cannot run within the memory this process may use: {message}{}; \
         raise the address-space limit or free memory",
        python.display(),
        limit.map_or(String::new(), |l| format!(
            " (address-space limit {})",
            crate::scenario::memory_estimate::human_bytes(l)
        ))
    )]
    DriverOutOfMemory {
        /// The interpreter that ran it.
        python: PathBuf,
        /// The line of its output that says so.
        message: String,
        /// The address-space limit in bytes, if one is set.
        limit: Option<u64>,
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

/// What a Python driver or probe wrote when it could not get memory: an
/// import that could not map a library, `MemoryError`, a failed thread or
/// allocation. The first such line, trimmed; `None` for any other failure.
pub fn memory_failure(stderr: &str) -> Option<String> {
    const SIGNS: [&str; 8] = [
        "failed to map segment from shared object",
        "MemoryError",
        "Cannot allocate memory",
        "cannot allocate memory",
        "std::bad_alloc",
        "out of memory",
        "pthread_create failed",
        "memory allocation failed",
    ];
    stderr
        .lines()
        .map(str::trim)
        .find(|l| SIGNS.iter().any(|s| l.contains(s)))
        .map(|l| {
            // The driver's list of names it could not import: the reason only.
            let l = match l.split_once("the module does not import: ") {
                Some((_, why)) => why.strip_suffix(')').unwrap_or(why),
                None => l,
            };
            l.chars().take(300).collect()
        })
}

/// This process's address-space limit in bytes, if one is set.
pub fn address_space_limit() -> Option<u64> {
    crate::scenario::memory_estimate::AddressSpace::current().map(|a| a.limit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_driver_short_of_memory_is_told_apart() {
        let import = "Traceback (most recent call last):\n  File \"x\", line 1\n\
                      ImportError: libtorch_cpu.so: failed to map segment from shared object\n";
        assert_eq!(
            memory_failure(import).as_deref(),
            Some("ImportError: libtorch_cpu.so: failed to map segment from shared object")
        );
        assert_eq!(
            memory_failure("Traceback\nMemoryError\n").as_deref(),
            Some("MemoryError")
        );
        assert_eq!(memory_failure("ValueError: bad block size\n"), None);
    }
}
