//! Running a driver's interpreter with a time-out: output goes to files,
//! the child is polled and killed at the deadline, never waited out.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Why a bounded child process could not be run.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// The scratch folder or an output file could not be created.
    #[error("cannot create {}: {source}", path.display())]
    Create {
        /// The folder or file.
        path: PathBuf,
        /// What the file system answered.
        #[source]
        source: std::io::Error,
    },
    /// The program did not start.
    #[error("cannot start {program:?}: {source}")]
    Start {
        /// The program.
        program: OsString,
        /// What the system answered.
        #[source]
        source: std::io::Error,
    },
    /// Asking whether the child had ended failed.
    #[error("waiting for {program:?}: {source}")]
    Wait {
        /// The program.
        program: OsString,
        /// What the system answered.
        #[source]
        source: std::io::Error,
    },
}

/// How a bounded child process ended.
#[derive(Debug)]
pub struct Finished {
    /// Exit status; `None` when it was killed at the deadline.
    pub status: Option<i32>,
    /// Everything the child wrote to stdout.
    pub stdout: String,
    /// Everything the child wrote to stderr.
    pub stderr: String,
}

impl Finished {
    /// Whether the child was killed at its deadline.
    pub fn timed_out(&self) -> bool {
        self.status.is_none()
    }

    /// The last lines of stderr, for an error message.
    pub fn stderr_tail(&self, lines: usize) -> String {
        let all: Vec<&str> = self.stderr.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

/// Run `cmd` with stdout and stderr captured in `scratch`, killing it after `limit`.
pub fn run_bounded(
    mut cmd: Command,
    scratch: &Path,
    limit: Duration,
) -> Result<Finished, ProcessError> {
    fn create(path: &Path) -> impl FnOnce(std::io::Error) -> ProcessError + '_ {
        move |source| ProcessError::Create {
            path: path.to_path_buf(),
            source,
        }
    }
    std::fs::create_dir_all(scratch).map_err(create(scratch))?;
    let out_path = scratch.join("stdout.txt");
    let err_path = scratch.join("stderr.txt");
    let out = std::fs::File::create(&out_path).map_err(create(&out_path))?;
    let err = std::fs::File::create(&err_path).map_err(create(&err_path))?;
    let started = Instant::now();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err))
        .spawn()
        .map_err(|source| ProcessError::Start {
            program: cmd.get_program().to_os_string(),
            source,
        })?;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status.code().unwrap_or(-1)),
            Ok(None) if started.elapsed() > limit => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(source) => {
                return Err(ProcessError::Wait {
                    program: cmd.get_program().to_os_string(),
                    source,
                })
            }
        }
    };
    let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
    Ok(Finished {
        status,
        stdout: read(&out_path),
        stderr: read(&err_path),
    })
}
