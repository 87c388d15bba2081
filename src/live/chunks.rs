//! How a live batch is split into driver processes: consecutive cases up to
//! a memory budget per process ("chunks"), several processes at once, and
//! the reports put back in case order.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Mutex};
use std::time::Duration;

use crate::scenario::{shape_and_place, Case, Outcome, Placed};

use super::blocks::BlockCheck;
use super::error::BatchError;
use super::python::Interpreter;
use super::run::{
    prepare_placed, remove_unless_kept, run_chunk, write_inputs, Hooks, JudgeDriverCase, Prepared,
};

/// Bytes of initial memory one batch has in flight at most: kvgeom keeps
/// every case's initial images until it judges the case, and the driver's
/// folder holds their files. With one driver process a chunk may hold all
/// of it; with several, each holds its share (one more chunk is prepared
/// while they run), and a larger batch runs as more processes, each paying
/// vLLM's import.
pub const CHUNK_MEMORY_BYTES: u64 = 2 << 30;

/// Driver processes a sweep runs at once by default: one per core, at most
/// this many (each holds vLLM's import, about 1 GB).
pub const MAX_DEFAULT_DRIVERS: usize = 4;

/// The default number of driver processes on this machine.
pub fn default_drivers() -> usize {
    std::thread::available_parallelism()
        .map_or(1, usize::from)
        .clamp(1, MAX_DEFAULT_DRIVERS)
}

/// Cases each default driver process gets at least: a process spends about
/// 10 s of CPU importing vLLM and a case about a quarter of a second, so a
/// second process pays for itself only on a batch this large.
pub const CASES_PER_DEFAULT_DRIVER: usize = 32;

/// Driver processes for a batch of `cases`: `threads` when given
/// (`--threads`), else [`default_drivers`], fewer for a small batch
/// ([`CASES_PER_DEFAULT_DRIVER`]).
pub fn drivers_for(threads: Option<usize>, cases: usize) -> usize {
    threads
        .unwrap_or_else(|| default_drivers().min(cases.div_ceil(CASES_PER_DEFAULT_DRIVER).max(1)))
}

/// One chunk's first case and its judged cases.
type ChunkResult<T> = (usize, Result<Vec<T>, BatchError>);

/// What every chunk of one batch shares.
pub(super) struct BatchContext<'a, T> {
    pub dir: &'a Path,
    pub cases: &'a [Case],
    pub checks: &'a [BlockCheck],
    pub python: &'a Interpreter,
    pub case_limit: Duration,
    pub hooks: &'a Hooks,
    /// Per case, its place phase when vLLM's scheduler makes its request
    /// (`None`: direct; shorter than the cases: the rest direct).
    pub scheduler: &'a [Option<super::place::SchedulerInfo>],
    /// How each case is judged.
    pub judge: &'a JudgeDriverCase<'a, T>,
}

/// Every case of the batch through vLLM's connector, each prepared for its
/// placement, in chunks run by up to `drivers` driver processes at once;
/// the judged cases in case order.
pub(super) fn run_chunks<T: Send>(
    batch: &BatchContext<'_, T>,
    placed: Vec<Placed>,
    drivers: usize,
) -> Result<Vec<T>, BatchError> {
    let drivers = drivers.clamp(1, batch.cases.len().max(1));
    let limits = ChunkLimits {
        bytes: CHUNK_MEMORY_BYTES / drivers as u64,
        cases: batch.cases.len().div_ceil(drivers),
    };
    if drivers == 1 {
        let mut out = Vec::with_capacity(batch.cases.len());
        produce(batch, placed, limits, |chunk| {
            out.extend(chunk.run(batch)?);
            Ok(())
        })?;
        return Ok(out);
    }
    let finished: Mutex<Vec<ChunkResult<T>>> = Mutex::new(Vec::new());
    let failed = AtomicBool::new(false);
    let (send, receive) = mpsc::sync_channel::<Chunk>(0);
    let receive = Mutex::new(receive);
    let produced = std::thread::scope(|scope| {
        for _ in 0..drivers {
            scope.spawn(|| loop {
                let next = receive.lock().unwrap_or_else(|e| e.into_inner()).recv();
                let Ok(chunk) = next else { break };
                if failed.load(Ordering::Relaxed) {
                    remove_unless_kept(&chunk.dir(batch.dir));
                    continue;
                }
                let first = chunk.first;
                let result = chunk.run(batch);
                if result.is_err() {
                    failed.store(true, Ordering::Relaxed);
                }
                finished
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push((first, result));
            });
        }
        let produced = produce(batch, placed, limits, |chunk| {
            // A driver failed: stop preparing (its error is the one reported).
            if failed.load(Ordering::Relaxed) {
                return Err(BatchError::LanesStopped);
            }
            // Blocks until a driver is free: at most one chunk waits.
            send.send(chunk)
                .map_err(|_| BatchError::LanesStopped)
                .map(drop)
        });
        drop(send);
        produced
    });
    let mut finished = finished.into_inner().unwrap_or_else(|e| e.into_inner());
    finished.sort_by_key(|(first, _)| *first);
    let mut out = Vec::with_capacity(batch.cases.len());
    for (_, result) in finished {
        out.extend(result?);
    }
    produced?;
    Ok(out)
}

/// Prepare the cases in order, each for its placement, and hand each full
/// chunk to `run`.
fn produce<T>(
    batch: &BatchContext<'_, T>,
    placed: Vec<Placed>,
    limits: ChunkLimits,
    mut run: impl FnMut(Chunk) -> Result<(), BatchError>,
) -> Result<(), BatchError> {
    let mut budget = ChunkBudget::new(limits);
    let mut chunk = Chunk::default();
    let mut chunks_started = 0;
    let mut placed = placed.into_iter();
    for (i, case) in batch.cases.iter().enumerate() {
        // The connector placed every case; a missing one is placed as
        // kvgeom's scenario would.
        let placed = placed.next().unwrap_or_else(|| shape_and_place(case));
        let mut p = prepare_placed(case, placed, &format!("c{i}"));
        if let Ok(p) = &mut p {
            p.spec.skip_receive_post_process = batch.hooks.skip_receive_post_process;
            p.spec.block_in_case = batch.hooks.block_cases.contains(&i);
            if let Some(Some(info)) = batch.scheduler.get(i) {
                p.spec.requests = super::place::RequestPath::Scheduler;
                p.place_dir = Some(info.dir.clone());
                if let Some([prefill, decode]) = &info.listed_blocks {
                    p.spec.prefill.request_blocks = prefill.clone();
                    p.spec.decode.request_blocks = decode.clone();
                }
            }
        }
        let bytes = p.as_ref().map_or(0, Prepared::memory_bytes);
        if !budget.admits(bytes) {
            run(std::mem::take(&mut chunk))?;
        }
        if chunk.prepared.is_empty() {
            chunk.first = i;
            chunk.index = chunks_started;
            chunks_started += 1;
        }
        if let Ok(p) = &p {
            write_inputs(&chunk.dir(batch.dir), p)?;
        }
        chunk.prepared.push(p);
    }
    if !chunk.prepared.is_empty() {
        run(chunk)?;
    }
    Ok(())
}

/// The most one chunk holds.
#[derive(Clone, Copy, Debug)]
struct ChunkLimits {
    /// Initial memory of its cases.
    bytes: u64,
    /// Its cases (so that a small batch still spreads over every driver).
    cases: usize,
}

/// The running total of one chunk; a chunk always takes its first case,
/// whatever its size.
#[derive(Clone, Copy, Debug)]
struct ChunkBudget {
    limits: ChunkLimits,
    used: u64,
    cases: usize,
}

impl ChunkBudget {
    fn new(limits: ChunkLimits) -> Self {
        ChunkBudget {
            limits,
            used: 0,
            cases: 0,
        }
    }

    /// Whether a case of `bytes` joins the current chunk; when not, the
    /// current chunk is full and the case starts the next one.
    fn admits(&mut self, bytes: u64) -> bool {
        let joins = self.cases == 0
            || (self.used.saturating_add(bytes) <= self.limits.bytes
                && self.cases < self.limits.cases);
        if joins {
            self.used = self.used.saturating_add(bytes);
            self.cases += 1;
        } else {
            self.used = bytes;
            self.cases = 1;
        }
        joins
    }
}

/// Consecutive cases run by one driver process, in their own folder.
#[derive(Default)]
struct Chunk {
    /// Index of the first case in the batch.
    first: usize,
    /// Index of the chunk's folder (`chunk<index>`).
    index: usize,
    prepared: Vec<Result<Prepared, Outcome>>,
}

impl Chunk {
    fn dir(&self, batch_dir: &Path) -> PathBuf {
        batch_dir.join(format!("chunk{}", self.index))
    }

    fn run<T>(self, batch: &BatchContext<'_, T>) -> Result<Vec<T>, BatchError> {
        let dir = self.dir(batch.dir);
        let end = self.first + self.prepared.len();
        let cases = &batch.cases[self.first..end];
        let scheduler = batch
            .scheduler
            .get(self.first..end.min(batch.scheduler.len()))
            .unwrap_or_default();
        // Each driver process derives the blocks of its own cases' geometries.
        let checks: Vec<BlockCheck> = batch
            .checks
            .iter()
            .filter(|c| {
                cases
                    .iter()
                    .any(|case| case.geometry_name() == c.geometry.name)
            })
            .cloned()
            .collect();
        let result = run_chunk(
            &dir,
            cases,
            self.prepared,
            &checks,
            batch.python,
            batch.case_limit,
            batch.hooks.record_traces.as_deref(),
            scheduler,
            batch.judge,
        );
        remove_unless_kept(&dir);
        result
    }
}

#[cfg(test)]
mod tests {
    use super::{default_drivers, drivers_for, ChunkBudget, ChunkLimits, CASES_PER_DEFAULT_DRIVER};

    /// Admitted sizes per chunk, for a run of case sizes.
    fn chunks(bytes: u64, cases: usize, sizes: &[u64]) -> Vec<Vec<u64>> {
        let mut budget = ChunkBudget::new(ChunkLimits { bytes, cases });
        let mut out: Vec<Vec<u64>> = Vec::new();
        for &size in sizes {
            if !budget.admits(size) || out.is_empty() {
                out.push(Vec::new());
            }
            out.last_mut().expect("a chunk").push(size);
        }
        out
    }

    #[test]
    fn a_chunk_takes_cases_up_to_its_limit() {
        assert_eq!(chunks(10, 9, &[4, 6, 1]), [vec![4, 6], vec![1]]);
        assert_eq!(chunks(10, 9, &[3, 3, 3, 3]), [vec![3, 3, 3], vec![3]]);
        assert_eq!(chunks(10, 9, &[0, 0, 10, 0]), [vec![0, 0, 10, 0]]);
    }

    #[test]
    fn a_case_larger_than_the_limit_runs_alone() {
        assert_eq!(chunks(10, 9, &[11, 11, 2]), [vec![11], vec![11], vec![2]]);
        assert_eq!(chunks(10, 9, &[2, 11, 2]), [vec![2], vec![11], vec![2]]);
    }

    #[test]
    fn a_chunk_takes_at_most_its_share_of_the_cases() {
        assert_eq!(
            chunks(100, 2, &[1, 1, 1, 1, 1]),
            [vec![1, 1], vec![1, 1], vec![1]]
        );
        assert_eq!(chunks(100, 1, &[1, 1]), [vec![1], vec![1]]);
    }

    #[test]
    fn a_small_batch_gets_one_default_driver_and_threads_given_are_kept() {
        assert_eq!(drivers_for(None, 1), 1);
        assert_eq!(drivers_for(None, CASES_PER_DEFAULT_DRIVER), 1);
        assert_eq!(
            drivers_for(None, CASES_PER_DEFAULT_DRIVER + 1),
            default_drivers().min(2)
        );
        assert_eq!(drivers_for(None, 100_000), default_drivers());
        assert_eq!(drivers_for(Some(3), 1), 3);
    }

    #[test]
    fn sizes_near_the_top_of_u64_do_not_overflow() {
        let limit = u64::MAX - 1;
        assert_eq!(chunks(limit, 9, &[limit, 2]), [vec![limit], vec![2]]);
    }
}
