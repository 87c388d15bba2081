//! What one case will take, known before it allocates anything: the arenas
//! (a pool of logical blocks x the padded page x the layer slots) of every
//! rank a transfer touches. Every rank's arenas are allocated, but an
//! arena's pages are only written (and so backed by memory) once something
//! accesses it, and in pull mode the prefill ranks no decode rank reads are
//! never accessed. The oracles recompute the initial fill instead of
//! keeping a copy. Pure arithmetic (and the connector's TP mapping), so an
//! absurd input is refused in microseconds instead of exhausting memory.

use serde::Serialize;

use super::case::Case;
use super::placement::pool_size;
use crate::connector::pull_source_ranks;
use crate::geometry::{Geometry, Mode};
use crate::scheduler::request_shape;

/// The bytes one case needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct MemoryEstimate {
    /// One prefill rank's arenas, all layer slots.
    pub prefill_rank_bytes: u64,
    /// One decode rank's arenas, all layer slots.
    pub decode_rank_bytes: u64,
    /// Prefill ranks a transfer touches (in push every one writes; in pull,
    /// the ranks some decode rank reads).
    pub prefill_ranks: u32,
    /// Decode ranks a transfer touches (all of them).
    pub decode_ranks: u32,
    /// Logical blocks in each prefill rank's pool.
    pub prefill_pool: u32,
    /// Logical blocks in each decode rank's pool.
    pub decode_pool: u32,
    /// The arenas of the ranks a transfer touches.
    pub arena_bytes: u64,
    /// The peak: the touched ranks' arenas (nothing else of the case's
    /// size is held).
    pub peak_bytes: u64,
}

/// Prefill ranks a case's transfers touch: all of them in push (each one
/// writes), in pull the union of every decode rank's READ sources.
pub fn touched_prefill_ranks(geometry: &Geometry, mode: Mode) -> Vec<u32> {
    let (p, d) = (geometry.prefill.tp_size, geometry.decode.tp_size);
    if mode == Mode::Push {
        return (0..p).collect();
    }
    // A decode engine of more ranks than the limits allow is refused before
    // any case runs; stay bounded regardless.
    let mut touched = std::collections::BTreeSet::new();
    for rank in 0..d.min(crate::limits::MAX_TP_SIZE) {
        touched.extend(pull_source_ranks(&geometry.model, rank, d, p));
        if touched.len() as u32 == p {
            break;
        }
    }
    touched.into_iter().collect()
}

/// The bytes `case` will allocate (saturating: an absurd case shows as
/// `u64::MAX`, never wraps).
pub fn estimate(case: &Case) -> MemoryEstimate {
    let g = &case.geometry;
    let shape = request_shape(g, case.prompt_len, case.prefix_hit, case.allocation);
    let needed = |blocks: &[u32]| blocks.iter().fold(0u32, |a, &b| a.saturating_add(b));
    let prefill_pool = pool_size(g.prefill.num_logical_blocks, needed(&shape.prefill_blocks));
    let decode_pool = pool_size(g.decode.num_logical_blocks, needed(&shape.decode_blocks));
    let rank = |pool: u32, page: u64| -> u128 {
        u128::from(pool) * u128::from(page) * u128::from(g.model.layer_slots)
    };
    let prefill_rank = rank(prefill_pool, g.prefill.unified_page_bytes(&g.model));
    let decode_rank = rank(decode_pool, g.decode.unified_page_bytes(&g.model));
    let prefill_ranks = touched_prefill_ranks(g, case.mode).len() as u32;
    let arenas =
        prefill_rank * u128::from(prefill_ranks) + decode_rank * u128::from(g.decode.tp_size);
    let fit = |v: u128| u64::try_from(v).unwrap_or(u64::MAX);
    MemoryEstimate {
        prefill_rank_bytes: fit(prefill_rank),
        decode_rank_bytes: fit(decode_rank),
        prefill_ranks,
        decode_ranks: g.decode.tp_size,
        prefill_pool,
        decode_pool,
        arena_bytes: fit(arenas),
        peak_bytes: fit(arenas),
    }
}

impl MemoryEstimate {
    /// Why the case does not fit `budget` bytes, and what to reduce.
    pub fn refusal(&self, case: &Case, budget: u64) -> String {
        format!(
            "{} N={} h={} {} {}: needs about {} (the arenas of the ranks its transfers touch: \
             prefill {} ranks x {}, decode {} ranks x {}), more than --max-memory {}; run a \
             shorter prompt, fewer layer slots or a smaller pool (num_logical_blocks), or raise \
             --max-memory",
            case.geometry_name(),
            case.prompt_len,
            case.prefix_hit,
            case.mode,
            case.allocation.as_str(),
            human_bytes(self.peak_bytes),
            self.prefill_ranks,
            human_bytes(self.prefill_rank_bytes),
            self.decode_ranks,
            human_bytes(self.decode_rank_bytes),
            human_bytes(budget)
        )
    }
}

/// `1.5 GiB`, `640 KiB`, `12 B`.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// A `--max-memory` value that is not a size.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    /// No number before the unit.
    #[error("`{text}`: not a size (e.g. 1.5G, 800M, 4096)")]
    NotANumber {
        /// The value as given.
        text: String,
    },
    /// A unit other than `K`, `M`, `G` or `T`.
    #[error("`{text}`: unknown unit `{unit}` (use K, M, G or T)")]
    UnknownUnit {
        /// The value as given.
        text: String,
        /// The unit, lower-cased.
        unit: String,
    },
    /// Less than one byte.
    #[error("`{text}`: must be at least one byte")]
    TooSmall {
        /// The value as given.
        text: String,
    },
    /// More than 2^64 bytes.
    #[error("`{text}`: above the largest size, 16 EiB")]
    TooLarge {
        /// The value as given.
        text: String,
    },
}

/// Parse a size: bytes, or a number with `K`, `M`, `G`, `T` (powers of
/// 1024, with or without `iB`/`B`), e.g. `1.5G`, `800MiB`, `4096`.
pub fn parse_size(text: &str) -> Result<u64, SizeError> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let value: f64 = number.parse().map_err(|_| SizeError::NotANumber {
        text: text.to_string(),
    })?;
    let scale: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" | "kib" => 1024.0,
        "m" | "mb" | "mib" => 1024.0 * 1024.0,
        "g" | "gb" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "t" | "tb" | "tib" => 1024.0_f64.powi(4),
        other => {
            return Err(SizeError::UnknownUnit {
                text: text.to_string(),
                unit: other.to_string(),
            })
        }
    };
    let bytes = value * scale;
    if bytes < 1.0 {
        return Err(SizeError::TooSmall {
            text: text.to_string(),
        });
    }
    if bytes > u64::MAX as f64 {
        return Err(SizeError::TooLarge {
            text: text.to_string(),
        });
    }
    Ok(bytes as u64)
}

/// The default budget: half of the memory available now (`MemAvailable`),
/// or 4 GiB where that cannot be read.
pub fn default_budget() -> u64 {
    let available = std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| {
        m.lines()
            .find(|l| l.starts_with("MemAvailable:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<u64>().ok())
            .map(|kb| kb * 1024)
    });
    available.map_or(4 << 30, |a| a / 2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_and_print() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("1.5G"), Ok(3 << 29));
        assert_eq!(parse_size("800MiB"), Ok(800 << 20));
        assert_eq!(
            parse_size("0"),
            Err(SizeError::TooSmall { text: "0".into() })
        );
        let parsecs = parse_size("12 parsecs").unwrap_err();
        assert_eq!(
            parsecs,
            SizeError::UnknownUnit {
                text: "12 parsecs".into(),
                unit: "parsecs".into()
            }
        );
        assert_eq!(
            parsecs.to_string(),
            "`12 parsecs`: unknown unit `parsecs` (use K, M, G or T)"
        );
        assert_eq!(
            parse_size("lots").unwrap_err().to_string(),
            "`lots`: not a size (e.g. 1.5G, 800M, 4096)"
        );
        assert_eq!(human_bytes(12), "12 B");
        assert_eq!(human_bytes(3 << 29), "1.5 GiB");
    }
}
