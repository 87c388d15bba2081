//! A set of byte intervals, for "is this range fully written" questions.

use std::ops::Range;

/// Disjoint, sorted, merged half-open intervals.
#[derive(Clone, Debug, Default)]
pub(crate) struct IntervalSet {
    merged: Vec<Range<u64>>,
}

impl IntervalSet {
    pub fn from_ranges(mut ranges: Vec<Range<u64>>) -> Self {
        ranges.retain(|r| r.start < r.end);
        ranges.sort_by_key(|r| r.start);
        let mut merged: Vec<Range<u64>> = Vec::with_capacity(ranges.len());
        for r in ranges {
            match merged.last_mut() {
                Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
                _ => merged.push(r),
            }
        }
        Self { merged }
    }

    /// Whether every byte of `r` is in the set.
    pub fn covers(&self, r: Range<u64>) -> bool {
        if r.start >= r.end {
            return true;
        }
        let i = self.merged.partition_point(|m| m.start <= r.start);
        i > 0 && self.merged[i - 1].end >= r.end
    }

    /// The parts of `r` not in the set.
    pub fn gaps(&self, r: Range<u64>) -> Vec<Range<u64>> {
        let mut out = Vec::new();
        let mut at = r.start;
        for m in &self.merged {
            if m.end <= at {
                continue;
            }
            if m.start >= r.end {
                break;
            }
            if m.start > at {
                out.push(at..m.start);
            }
            at = at.max(m.end);
        }
        if at < r.end {
            out.push(at..r.end);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merged_intervals_answer_coverage_and_gaps() {
        let set = IntervalSet::from_ranges(vec![10..20, 0..5, 18..30, 40..41]);
        assert!(set.covers(10..30));
        assert!(!set.covers(4..11));
        assert!(set.covers(7..7));
        assert_eq!(set.gaps(0..45), vec![5..10, 30..40, 41..45]);
        assert_eq!(set.gaps(12..25), Vec::<Range<u64>>::new());
    }
}
