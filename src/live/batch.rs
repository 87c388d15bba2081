//! The entry point of the live mode: a batch of cases in a fresh scratch
//! folder, run by the driver processes ([`super::chunks`]).

use std::path::PathBuf;
use std::time::Duration;

use crate::scenario::{Case, Placed};

use super::blocks::BlockCheck;
use super::chunks::{run_chunks, BatchContext};
use super::error::BatchError;
use super::python::Interpreter;
use super::run::{remove_unless_kept, Hooks, JudgeDriverCase};

/// A fresh scratch folder for one batch, created here. Process ids are
/// reused (pid_max may be 32768): a folder of that name may be left over,
/// kept (`KVGEOM_KEEP_LIVE`), or still written by a driver whose kvgeom
/// was killed, so an existing one is never taken.
fn scratch_dir() -> PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let name = || {
        std::env::temp_dir().join(format!(
            "kvgeom-live-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ))
    };
    let mut dir = name();
    for _ in 0..10_000 {
        match std::fs::create_dir(&dir) {
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => dir = name(),
            // Created, or an error the batch reports when it creates its chunks.
            _ => break,
        }
    }
    dir
}

/// How the driver processes of a batch run.
#[derive(Clone, Copy)]
pub struct DriverSettings<'a> {
    /// The interpreter with vLLM (and what moves the bytes).
    pub python: &'a Interpreter,
    /// Deployments whose blocks the driver derives with vLLM's own
    /// functions (each case of a checked geometry gets its comparison).
    pub checks: &'a [BlockCheck],
    /// Time-out of one case inside the driver.
    pub case_limit: Duration,
    /// Test hooks, and where traces are saved.
    pub hooks: &'a Hooks,
    /// Driver processes run at once.
    pub drivers: usize,
}

/// Run every case, prepared for its placement (`placed`, in case order;
/// a case whose request vLLM's scheduler makes, `settings.hooks.requests`,
/// for the placement the driver's place phase gives it first),
/// through vLLM's connector in a fresh scratch folder, in driver batches of
/// at most [`CHUNK_MEMORY_BYTES`](super::chunks::CHUNK_MEMORY_BYTES) of
/// initial memory, up to `settings.drivers` driver processes at once, each
/// case handed to `judge` while its driver output is on disk; the judged
/// cases in order. `Err` when the driver cannot run at all (the caller
/// exits 2).
pub fn run_in_scratch<T: Send>(
    cases: &[Case],
    placed: Vec<Placed>,
    settings: DriverSettings<'_>,
    judge: &JudgeDriverCase<'_, T>,
) -> Result<Vec<T>, BatchError> {
    let dir = scratch_dir();
    // The place phase first: the requests vLLM's scheduler makes replace
    // the given placement of their cases.
    let placed_by_scheduler = match super::place::place_batch(
        &dir.join("place"),
        cases,
        settings.hooks.requests,
        settings.python,
    ) {
        Ok(p) => p,
        Err(e) => {
            remove_unless_kept(&dir);
            return Err(e);
        }
    };
    let mut placed = placed;
    if placed_by_scheduler.iter().any(Option::is_some) {
        for case in &cases[placed.len().min(cases.len())..] {
            placed.push(crate::scenario::shape_and_place(case));
        }
    }
    let mut scheduler = Vec::with_capacity(cases.len());
    for (i, s) in placed_by_scheduler.into_iter().enumerate() {
        scheduler.push(s.map(|s| {
            let mut info = s.info;
            info.placement = s.placed.as_ref().ok().cloned();
            placed[i] = s.placed;
            info
        }));
    }
    let batch = BatchContext {
        dir: &dir,
        cases,
        checks: settings.checks,
        python: settings.python,
        case_limit: settings.case_limit,
        hooks: settings.hooks,
        scheduler: &scheduler,
        judge,
    };
    let result = run_chunks(&batch, placed, settings.drivers);
    remove_unless_kept(&dir);
    result
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_scratch_folder_is_created_fresh_never_one_that_exists() {
        let first = super::scratch_dir();
        assert!(first.is_dir(), "{}", first.display());
        // The next names, as a driver of an earlier process with the same
        // id might have left (or still be filling) them.
        let name = first.file_name().unwrap().to_str().unwrap().to_string();
        let (stem, n) = name.rsplit_once('-').unwrap();
        let n: u64 = n.parse().unwrap();
        let taken: Vec<std::path::PathBuf> = (1..=2)
            .map(|k| first.with_file_name(format!("{stem}-{}", n + k)))
            .collect();
        for t in &taken {
            std::fs::create_dir_all(t).unwrap();
            std::fs::write(t.join("result.json"), b"{}").unwrap();
        }
        let next = super::scratch_dir();
        let fresh = std::fs::read_dir(&next).map(|d| d.count());
        for d in taken.iter().chain([&first, &next]) {
            let _ = std::fs::remove_dir_all(d);
        }
        assert!(!taken.contains(&next), "{}", next.display());
        assert_eq!(fresh.unwrap(), 0, "{}", next.display());
    }
}
