//! Running the driver's interpreter with a time-out: output goes to files,
//! the child is polled and killed at the deadline, never waited out.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How a bounded child process ended.
#[derive(Debug)]
pub struct Finished {
    /// Exit status; `None` when it was killed at the deadline.
    pub status: Option<i32>,
    /// Everything the child wrote to stdout.
    pub stdout: String,
    /// Everything the child wrote to stderr.
    pub stderr: String,
    /// Wall time from start to exit (or to the kill).
    pub elapsed: Duration,
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
pub fn run_bounded(mut cmd: Command, scratch: &Path, limit: Duration) -> Result<Finished, String> {
    std::fs::create_dir_all(scratch)
        .map_err(|e| format!("cannot create {}: {e}", scratch.display()))?;
    let out_path = scratch.join("stdout.txt");
    let err_path = scratch.join("stderr.txt");
    let out = std::fs::File::create(&out_path)
        .map_err(|e| format!("cannot create {}: {e}", out_path.display()))?;
    let err = std::fs::File::create(&err_path)
        .map_err(|e| format!("cannot create {}: {e}", err_path.display()))?;
    let started = Instant::now();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err))
        .spawn()
        .map_err(|e| format!("cannot start {:?}: {e}", cmd.get_program()))?;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status.code().unwrap_or(-1)),
            Ok(None) if started.elapsed() > limit => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(format!("waiting for {:?}: {e}", cmd.get_program())),
        }
    };
    let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
    Ok(Finished {
        status,
        stdout: read(&out_path),
        stderr: read(&err_path),
        elapsed: started.elapsed(),
    })
}
