//! Descriptor lists as the connector hands them to NIXL: strided runs
//! `(addr, len, dev, stride, count)` that expand to plain `(addr, len, dev)`
//! rows. Desc ids index the expanded rows.

use serde::{Deserialize, Serialize};

/// One plain descriptor: `len` bytes at `addr` on device `dev`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct DescRow {
    /// Start address.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// Device ordinal (0 for host memory).
    pub dev: u32,
}

impl DescRow {
    /// One past the last byte.
    pub fn end(&self) -> u64 {
        self.addr + self.len
    }
}

/// `count` descriptors of `len` bytes, the first at `addr`, `stride` bytes apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct StridedRun {
    /// Address of the first descriptor.
    pub addr: u64,
    /// Bytes of each descriptor.
    pub len: u64,
    /// Device ordinal (0 for host memory).
    pub dev: u32,
    /// Bytes from one descriptor's start to the next one's.
    pub stride: u64,
    /// Descriptors in the run.
    pub count: u64,
}

impl StridedRun {
    /// The `k`-th descriptor of the run.
    pub fn row(&self, k: u64) -> DescRow {
        DescRow {
            addr: self.addr + k * self.stride,
            len: self.len,
            dev: self.dev,
        }
    }
}

/// An ordered descriptor list made of strided runs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DescList {
    runs: Vec<StridedRun>,
    /// `starts[i]` = id of the first row of run `i`.
    starts: Vec<u64>,
    total: u64,
}

impl DescList {
    /// An empty list.
    pub fn new() -> Self {
        Self::default()
    }

    /// A list of these runs, in order.
    pub fn from_runs(runs: impl IntoIterator<Item = StridedRun>) -> Self {
        let runs = runs.into_iter();
        let mut list = Self::new();
        list.starts.reserve(runs.size_hint().0);
        list.runs.reserve(runs.size_hint().0);
        for run in runs {
            list.push_run(run);
        }
        list
    }

    /// Plain rows, one run each.
    pub fn from_rows(rows: impl IntoIterator<Item = DescRow>) -> Self {
        Self::from_runs(rows.into_iter().map(|r| StridedRun {
            addr: r.addr,
            len: r.len,
            dev: r.dev,
            stride: r.len,
            count: 1,
        }))
    }

    /// Append a run (an empty run adds nothing).
    pub fn push_run(&mut self, run: StridedRun) {
        if run.count == 0 {
            return;
        }
        self.starts.push(self.total);
        self.total += run.count;
        self.runs.push(run);
    }

    /// Append one row.
    pub fn push_row(&mut self, row: DescRow) {
        self.push_run(StridedRun {
            addr: row.addr,
            len: row.len,
            dev: row.dev,
            stride: row.len,
            count: 1,
        });
    }

    /// Number of expanded rows (the desc id range).
    pub fn len(&self) -> u64 {
        self.total
    }

    /// Whether the list has no rows.
    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// The runs, in order.
    pub fn runs(&self) -> &[StridedRun] {
        &self.runs
    }

    /// Row `id`, or `None` when out of range.
    pub fn get(&self, id: u64) -> Option<DescRow> {
        if id >= self.total {
            return None;
        }
        let run = self.starts.partition_point(|&s| s <= id) - 1;
        Some(self.runs[run].row(id - self.starts[run]))
    }

    /// All rows in id order.
    pub fn rows(&self) -> impl Iterator<Item = DescRow> + '_ {
        self.runs
            .iter()
            .flat_map(|run| (0..run.count).map(move |k| run.row(k)))
    }

    /// Plain rows, collected.
    pub fn expand(&self) -> Vec<DescRow> {
        self.rows().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strided_runs_expand_in_id_order() {
        let list = DescList::from_runs([
            StridedRun {
                addr: 100,
                len: 16,
                dev: 0,
                stride: 16,
                count: 2,
            },
            StridedRun {
                addr: 1000,
                len: 8,
                dev: 0,
                stride: 32,
                count: 3,
            },
        ]);
        assert_eq!(list.len(), 5);
        let addrs: Vec<u64> = list.rows().map(|r| r.addr).collect();
        assert_eq!(addrs, [100, 116, 1000, 1032, 1064]);
        assert_eq!(
            list.get(3),
            Some(DescRow {
                addr: 1032,
                len: 8,
                dev: 0
            })
        );
        assert_eq!(list.get(5), None);
    }
}
