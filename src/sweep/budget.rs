//! A memory budget shared by the cases of a sweep: a case starts only once
//! its estimated peak fits beside the cases already running, so a sweep's
//! peak stays within the budget however many threads it has. A case larger
//! than the whole budget runs alone (the command line refuses such a case
//! before the sweep starts).

use std::sync::{Condvar, Mutex};

/// Bytes in use by running cases, against a limit.
#[derive(Debug)]
pub struct MemoryBudget {
    limit: u64,
    in_use: Mutex<u64>,
    freed: Condvar,
}

impl MemoryBudget {
    /// A budget of `limit` bytes.
    pub fn new(limit: u64) -> Self {
        MemoryBudget {
            limit,
            in_use: Mutex::new(0),
            freed: Condvar::new(),
        }
    }

    /// The limit in bytes.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Run `f` once `bytes` fit (all of the budget when `bytes` exceed it).
    pub fn run<T>(&self, bytes: u64, f: impl FnOnce() -> T) -> T {
        let want = bytes.min(self.limit);
        {
            let mut used = self.in_use.lock().unwrap_or_else(|e| e.into_inner());
            while *used > 0 && *used + want > self.limit {
                used = self.freed.wait(used).unwrap_or_else(|e| e.into_inner());
            }
            *used += want;
        }
        let out = f();
        let mut used = self.in_use.lock().unwrap_or_else(|e| e.into_inner());
        *used -= want;
        self.freed.notify_all();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    #[test]
    fn running_cases_never_exceed_the_budget() {
        let budget = MemoryBudget::new(100);
        let (live, peak) = (AtomicU64::new(0), AtomicU64::new(0));
        std::thread::scope(|s| {
            for i in 0..16u64 {
                let (budget, live, peak) = (&budget, &live, &peak);
                s.spawn(move || {
                    let bytes = 30 + i % 3 * 10;
                    budget.run(bytes, || {
                        let now = live.fetch_add(bytes, Ordering::SeqCst) + bytes;
                        peak.fetch_max(now, Ordering::SeqCst);
                        std::thread::sleep(std::time::Duration::from_millis(2));
                        live.fetch_sub(bytes, Ordering::SeqCst);
                    });
                });
            }
        });
        let peak = peak.load(Ordering::SeqCst);
        assert!((30..=100).contains(&peak), "peak {peak}");
        // Larger than the whole budget: runs, alone.
        assert_eq!(budget.run(500, || 7), 7);
    }
}
