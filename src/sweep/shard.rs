//! Splitting one sweep over several runners: `--shard K/N` keeps the cases
//! whose position in the sweep's order is `K - 1` modulo `N`, so N runners
//! with the same inputs and options cover every case exactly once. Each
//! shard's report records the shard, the sweep's total case count and a
//! fingerprint of its inputs and options; `kvgeom report merge` joins them.

use serde::{Deserialize, Serialize};

use super::plan::{PlanOptions, SourcedGeometry};
use crate::scenario::Case;

/// One shard of a sweep.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shard {
    /// 1-based shard number.
    pub index: u32,
    /// How many shards the sweep is split into.
    pub count: u32,
    /// Cases of the whole sweep (every shard).
    pub total_cases: usize,
    /// FNV-1a hash of the geometries and options: equal on every shard of one sweep.
    pub fingerprint: String,
}

/// A `--shard` value that is not `K/N` with `1 <= K <= N`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("`{text}`: expected K/N with 1 <= K <= N, e.g. 2/4")]
pub struct ShardError {
    /// The value as given.
    pub text: String,
}

/// `K/N` with `1 <= K <= N`.
pub fn parse_shard(text: &str) -> Result<(u32, u32), ShardError> {
    let bad = || ShardError {
        text: text.to_string(),
    };
    let (k, n) = text.split_once('/').ok_or_else(bad)?;
    let k: u32 = k.trim().parse().map_err(|_| bad())?;
    let n: u32 = n.trim().parse().map_err(|_| bad())?;
    if k == 0 || n == 0 || k > n {
        return Err(bad());
    }
    Ok((k, n))
}

/// The positions (in the full sweep) of shard `index` of `count`.
pub fn positions(total: usize, index: u32, count: u32) -> Vec<usize> {
    (0..total)
        .filter(|i| i % count as usize == (index - 1) as usize)
        .collect()
}

/// FNV-1a, 64 bits, as 16 hex digits.
pub fn fingerprint(parts: &[String]) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for byte in part.bytes().chain([0xff]) {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    }
    format!("{hash:016x}")
}

/// Shard `index` of `count` of a sweep's cases: the cases it keeps, its
/// [`Shard`] record and their positions in the whole sweep. The fingerprint
/// covers the geometries, the plan options and `options` (whatever else
/// changes the cases' outcomes, e.g. the transport or the connector).
pub fn select(
    all_cases: &[Case],
    (index, count): (u32, u32),
    sources: &[SourcedGeometry],
    plan: &PlanOptions,
    options: &str,
) -> (Vec<Case>, Shard, Vec<usize>) {
    let mut parts: Vec<String> = sources
        .iter()
        .map(|s| {
            let file = s.file.as_ref().map(|f| f.display().to_string());
            format!("{file:?}\n{}", crate::geometry::to_toml(&s.geometry))
        })
        .collect();
    parts.push(format!(
        "{:?} {:?} {:?} {:?} {} {options}",
        plan.prompts, plan.modes, plan.allocations, plan.variant, plan.seed
    ));
    let positions = positions(all_cases.len(), index, count);
    let info = Shard {
        index,
        count,
        total_cases: all_cases.len(),
        fingerprint: fingerprint(&parts),
    };
    let mine = positions.iter().map(|&i| all_cases[i].clone()).collect();
    (mine, info, positions)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_cover_every_case_once() {
        let mut all: Vec<usize> = (1..=3).flat_map(|k| positions(10, k, 3)).collect();
        all.sort_unstable();
        assert_eq!(all, (0..10).collect::<Vec<_>>());
        assert_eq!(parse_shard("2/4"), Ok((2, 4)));
        for bad in ["0/4", "5/4", "2", "a/b", "1/0"] {
            assert_eq!(
                parse_shard(bad).map_err(|e| e.to_string()),
                Err(format!("`{bad}`: expected K/N with 1 <= K <= N, e.g. 2/4")),
            );
        }
        assert_ne!(
            fingerprint(&["a".into(), "b".into()]),
            fingerprint(&["ab".into()])
        );
    }
}
