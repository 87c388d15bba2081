//! What one case will allocate, known before it allocates anything: every
//! rank's arenas (its pool of logical blocks x the padded page x the layer
//! slots) and the copy of them the oracles compare against. Pure
//! arithmetic, so an absurd input is refused in microseconds instead of
//! exhausting memory.

use serde::Serialize;

use super::case::Case;
use super::placement::pool_size;
use crate::scheduler::request_shape;

/// The bytes one case needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct MemoryEstimate {
    /// One prefill rank's arenas, all layer slots.
    pub prefill_rank_bytes: u64,
    /// One decode rank's arenas, all layer slots.
    pub decode_rank_bytes: u64,
    /// Prefill ranks (the prefill engine's TP size).
    pub prefill_ranks: u32,
    /// Decode ranks (the decode engine's TP size).
    pub decode_ranks: u32,
    /// Logical blocks in each prefill rank's pool.
    pub prefill_pool: u32,
    /// Logical blocks in each decode rank's pool.
    pub decode_pool: u32,
    /// Every arena of both engines.
    pub arena_bytes: u64,
    /// The peak: the arenas and the snapshot the oracles compare against.
    pub peak_bytes: u64,
}

/// Copies of the arenas held at the peak: the arenas themselves and the
/// snapshot taken before the transfer.
const ARENA_COPIES: u64 = 2;

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
    let arenas =
        prefill_rank * u128::from(g.prefill.tp_size) + decode_rank * u128::from(g.decode.tp_size);
    let fit = |v: u128| u64::try_from(v).unwrap_or(u64::MAX);
    MemoryEstimate {
        prefill_rank_bytes: fit(prefill_rank),
        decode_rank_bytes: fit(decode_rank),
        prefill_ranks: g.prefill.tp_size,
        decode_ranks: g.decode.tp_size,
        prefill_pool,
        decode_pool,
        arena_bytes: fit(arenas),
        peak_bytes: fit(arenas * u128::from(ARENA_COPIES)),
    }
}

impl MemoryEstimate {
    /// Why the case does not fit `budget` bytes, and what to reduce.
    pub fn refusal(&self, case: &Case, budget: u64) -> String {
        format!(
            "{} N={} h={} {} {}: needs about {} (prefill {} ranks x {}, decode {} ranks x {}, \
             twice: the arenas and their snapshot), more than --max-memory {}; run a shorter \
             prompt, fewer layer slots or a smaller pool (num_logical_blocks), or raise \
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

/// Parse a size: bytes, or a number with `K`, `M`, `G`, `T` (powers of
/// 1024, with or without `iB`/`B`), e.g. `1.5G`, `800MiB`, `4096`.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("`{text}`: not a size (e.g. 1.5G, 800M, 4096)"))?;
    let scale: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kb" | "kib" => 1024.0,
        "m" | "mb" | "mib" => 1024.0 * 1024.0,
        "g" | "gb" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "t" | "tb" | "tib" => 1024.0_f64.powi(4),
        other => {
            return Err(format!(
                "`{text}`: unknown unit `{other}` (use K, M, G or T)"
            ))
        }
    };
    let bytes = value * scale;
    if bytes < 1.0 {
        return Err(format!("`{text}`: must be at least one byte"));
    }
    if bytes > u64::MAX as f64 {
        return Err(format!("`{text}`: above the largest size, 16 EiB"));
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
        assert!(parse_size("0").is_err());
        assert!(parse_size("12 parsecs")
            .unwrap_err()
            .contains("unknown unit"));
        assert!(parse_size("lots").is_err());
        assert_eq!(human_bytes(12), "12 B");
        assert_eq!(human_bytes(3 << 29), "1.5 GiB");
    }
}
