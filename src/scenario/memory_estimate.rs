//! What one case will take, known before it allocates anything: the arenas
//! (a pool of logical blocks x the padded page x the layer slots) of every
//! rank a transfer touches. In pull mode the prefill ranks no decode rank
//! reads get no memory (their arenas are addresses and sizes only), and an
//! arena's pages are only written (and so backed by memory) once something
//! accesses it. The oracles recompute the initial fill instead of keeping a
//! copy. The budget the estimate is held against (`--max-memory`, and what
//! an address-space limit leaves) is [`Budget`]. Pure arithmetic (and the connector's TP mapping), so an
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
    /// size is held). The ranks no transfer touches get no memory at all
    /// (addresses only), so this is also what the case maps.
    pub peak_bytes: u64,
    /// The arenas of every rank, touched or not: what a case maps and
    /// fills where every rank needs real memory (`--transport nixl`,
    /// `--memory vram`, the live mode's preparation).
    pub every_rank_bytes: u64,
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
    let touched = touched_prefill_ranks(g, case.mode).len() as u32;
    MemoryEstimate::of_ranks(
        EngineShare {
            rank_bytes: prefill_rank,
            ranks: g.prefill.tp_size,
            pool: prefill_pool,
        },
        EngineShare {
            rank_bytes: decode_rank,
            ranks: g.decode.tp_size,
            pool: decode_pool,
        },
        touched,
    )
}

/// One engine's part of a case: the bytes of one rank, its ranks and its
/// pool's blocks.
#[derive(Clone, Copy, Debug)]
pub struct EngineShare {
    /// One rank's arenas, all layer slots (in 128 bits: an absurd case
    /// saturates in the estimate instead of wrapping).
    pub rank_bytes: u128,
    /// The engine's ranks.
    pub ranks: u32,
    /// Blocks (or pages) of each rank's pool.
    pub pool: u32,
}

impl MemoryEstimate {
    /// The estimate of `prefill` and `decode`, of which `touched_prefill`
    /// prefill ranks (and every decode rank) are touched; saturating.
    pub fn of_ranks(prefill: EngineShare, decode: EngineShare, touched_prefill: u32) -> Self {
        let fit = |v: u128| u64::try_from(v).unwrap_or(u64::MAX);
        let decode_all = decode.rank_bytes * u128::from(decode.ranks);
        let arenas = prefill.rank_bytes * u128::from(touched_prefill) + decode_all;
        let every = prefill.rank_bytes * u128::from(prefill.ranks) + decode_all;
        MemoryEstimate {
            prefill_rank_bytes: fit(prefill.rank_bytes),
            decode_rank_bytes: fit(decode.rank_bytes),
            prefill_ranks: touched_prefill,
            decode_ranks: decode.ranks,
            prefill_pool: prefill.pool,
            decode_pool: decode.pool,
            arena_bytes: fit(arenas),
            peak_bytes: fit(arenas),
            every_rank_bytes: fit(every),
        }
    }

    /// The bytes the case maps: [`peak_bytes`](Self::peak_bytes), or
    /// [`every_rank_bytes`](Self::every_rank_bytes) where every rank needs
    /// real memory.
    pub fn mapped_bytes(&self, every_rank: bool) -> u64 {
        if every_rank {
            self.every_rank_bytes
        } else {
            self.peak_bytes
        }
    }

    /// What kvgeom holds to run `case` against vLLM's connector (the live
    /// mode) or to rebuild a recorded trace: every rank's arenas and a copy
    /// of their initial images (the preparation), and the case's own run.
    pub fn prepared_bytes(&self) -> u64 {
        self.every_rank_bytes
            .saturating_mul(2)
            .saturating_add(self.peak_bytes)
    }

    /// Why the case does not fit `budget`, and what to reduce.
    pub fn refusal(&self, case: &Case, budget: &Budget) -> String {
        self.refusal_of(case, false, None, budget)
    }

    /// [`refusal`](Self::refusal) for the case's
    /// [`mapped_bytes`](Self::mapped_bytes) plus `extra` (bytes and what
    /// they are for).
    pub fn refusal_of(
        &self,
        case: &Case,
        every_rank: bool,
        extra: Option<(u64, &str)>,
        budget: &Budget,
    ) -> String {
        let prefill_ranks = if every_rank {
            case.geometry.prefill.tp_size
        } else {
            self.prefill_ranks
        };
        let mut what = format!(
            "the arenas of {}: prefill {prefill_ranks} ranks x {}, decode {} ranks x {}",
            if every_rank {
                "every rank"
            } else {
                "the ranks its transfers touch"
            },
            human_bytes(self.prefill_rank_bytes),
            self.decode_ranks,
            human_bytes(self.decode_rank_bytes)
        );
        let mut need = self.mapped_bytes(every_rank);
        if let Some((bytes, purpose)) = extra {
            need = need.saturating_add(bytes);
            what.push_str(&format!(", and {} {purpose}", human_bytes(bytes)));
        }
        format!(
            "{}: needs about {} ({what}), more than {}; run a shorter prompt, \
             fewer layer slots or a smaller pool (num_logical_blocks), or raise {}",
            case.label(),
            human_bytes(need),
            budget.describe(),
            budget.raise_hint(),
        )
    }
}

/// Address space kept back from an address-space limit for the process's
/// own needs (code, heap, thread stacks): this much, plus
/// [`ADDRESS_SPACE_PER_THREAD`] per core.
pub const ADDRESS_SPACE_MARGIN: u64 = 256 << 20;

/// Address space kept back per core (a worker thread's stack and its
/// allocator arena, which reserves 64 MiB).
pub const ADDRESS_SPACE_PER_THREAD: u64 = 80 << 20;

/// What an address-space limit (`RLIMIT_AS`, `ulimit -v`) leaves this
/// process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct AddressSpace {
    /// The soft limit in bytes.
    pub limit: u64,
    /// The process's mapped (virtual) size when the budget was set
    /// (`VmSize`).
    pub mapped: u64,
    /// Kept back for the process's own needs.
    pub margin: u64,
}

impl AddressSpace {
    /// The limit of this process, if one is set (`/proc/self/limits`,
    /// `/proc/self/status`; `None` off Linux).
    pub fn current() -> Option<Self> {
        let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
        let limit = address_space_limit(&limits)?;
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let mapped = status
            .lines()
            .find(|l| l.starts_with("VmSize:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024);
        let cores = std::thread::available_parallelism().map_or(4, |n| n.get() as u64);
        Some(AddressSpace {
            limit,
            mapped,
            margin: ADDRESS_SPACE_MARGIN + ADDRESS_SPACE_PER_THREAD * cores.min(64),
        })
    }

    /// The bytes left for KV memory: the limit less what is mapped and the
    /// margin.
    pub fn room(&self) -> u64 {
        self.limit
            .saturating_sub(self.mapped)
            .saturating_sub(self.margin)
    }
}

/// The soft `Max address space` of a `/proc/self/limits` text, in bytes;
/// `None` when unlimited or absent.
pub fn address_space_limit(limits: &str) -> Option<u64> {
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max address space"))?;
    let soft = line
        .strip_prefix("Max address space")?
        .split_whitespace()
        .next()?;
    soft.parse().ok()
}

/// The memory a command's cases may take: the smaller of `--max-memory`
/// (default: half of the memory available) and what an address-space
/// limit leaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Budget {
    /// The budget in bytes.
    pub bytes: u64,
    /// `--max-memory`, or its default.
    pub max_memory: u64,
    /// Whether `--max-memory` was given.
    pub explicit: bool,
    /// The address-space limit, if one is set.
    pub address_space: Option<AddressSpace>,
    /// A command's own limit below both, and what it is for
    /// ([`capped`](Self::capped)).
    pub cap: Option<(u64, &'static str)>,
}

impl Budget {
    /// The budget for `max_memory` (`None`: half of the memory available)
    /// under this process's address-space limit.
    pub fn new(max_memory: Option<u64>) -> Self {
        Self::under(max_memory, AddressSpace::current())
    }

    /// The budget for `max_memory` under `address_space`.
    pub fn under(max_memory: Option<u64>, address_space: Option<AddressSpace>) -> Self {
        let max = max_memory.unwrap_or_else(half_available);
        let bytes = address_space.map_or(max, |a| a.room().min(max));
        Budget {
            bytes,
            max_memory: max,
            explicit: max_memory.is_some(),
            address_space,
            cap: None,
        }
    }

    /// The budget, at most `bytes` (a command's own limit, `what`).
    pub fn capped(self, bytes: u64, what: &'static str) -> Self {
        if bytes >= self.bytes {
            return self;
        }
        Budget {
            bytes,
            cap: Some((bytes, what)),
            ..self
        }
    }

    /// Whether the address-space limit, not `--max-memory`, sets the budget.
    pub fn limited_by_address_space(&self) -> bool {
        self.address_space
            .is_some_and(|a| a.room() < self.max_memory)
    }

    /// `--max-memory 4.0 GiB`, or the room an address-space limit leaves.
    pub fn describe(&self) -> String {
        if let Some((bytes, what)) = self.cap {
            return format!("{what} {}", human_bytes(bytes));
        }
        match self.address_space {
            Some(a) if self.limited_by_address_space() => format!(
                "the {} this process's address-space limit leaves (ulimit -v {}, {} mapped \
                 already, {} kept for the process; --max-memory {})",
                human_bytes(self.bytes),
                human_bytes(a.limit),
                human_bytes(a.mapped),
                human_bytes(a.margin),
                human_bytes(self.max_memory)
            ),
            _ if self.explicit => format!("--max-memory {}", human_bytes(self.bytes)),
            _ => format!(
                "--max-memory {} (its default: half of the memory available)",
                human_bytes(self.bytes)
            ),
        }
    }

    /// What to raise: the limit, or `--max-memory`.
    pub fn raise_hint(&self) -> &'static str {
        if self.cap.is_some() {
            "nothing: it is a fixed limit"
        } else if self.limited_by_address_space() {
            "the address-space limit"
        } else {
            "--max-memory"
        }
    }

    /// Whether `need` bytes fit; otherwise the refusal naming `what`, the
    /// bytes, the budget and how to need less (`reduce`).
    pub fn check(&self, what: &str, need: u64, reduce: &str) -> Result<(), OverBudget> {
        if need <= self.bytes {
            return Ok(());
        }
        Err(OverBudget {
            what: what.to_string(),
            need,
            budget: self.describe(),
            reduce: reduce.to_string(),
            raise: self.raise_hint(),
        })
    }
}

/// Something that needs more than the budget.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{what}: needs about {}, more than {budget}; {reduce}, or raise {raise}", human_bytes(*.need))]
pub struct OverBudget {
    /// What needs the memory.
    pub what: String,
    /// The bytes it needs.
    pub need: u64,
    /// The budget ([`Budget::describe`]).
    pub budget: String,
    /// How to need less.
    pub reduce: String,
    /// What to raise ([`Budget::raise_hint`]).
    pub raise: &'static str,
}

/// The budget a command chose ([`set_process_budget`]), which the sweep's
/// runners take as their default.
static PROCESS_BUDGET: std::sync::OnceLock<Budget> = std::sync::OnceLock::new();

/// Make `budget` the default of this process's later runs (the first call
/// wins).
pub fn set_process_budget(budget: Budget) {
    let _ = PROCESS_BUDGET.set(budget);
}

/// The budget a command chose ([`set_process_budget`]), or else the
/// default: half of the memory available, within what an address-space
/// limit leaves.
pub fn process_budget() -> Budget {
    PROCESS_BUDGET
        .get()
        .copied()
        .unwrap_or_else(|| Budget::new(None))
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

/// The default budget in bytes: [`process_budget`]'s.
pub fn default_budget() -> u64 {
    process_budget().bytes
}

/// Half of the memory available now (`MemAvailable`), or 4 GiB where that
/// cannot be read.
fn half_available() -> u64 {
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

    #[test]
    fn an_address_space_limit_caps_the_budget() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max address space         3221225472           unlimited            bytes\n";
        assert_eq!(address_space_limit(limits), Some(3 << 30));
        let unlimited =
            "Max address space         unlimited            unlimited            bytes\n";
        assert_eq!(address_space_limit(unlimited), None);
        let space = AddressSpace {
            limit: 3 << 30,
            mapped: 1 << 30,
            margin: 512 << 20,
        };
        assert_eq!(space.room(), 1536 << 20);
        let capped = Budget::under(Some(8 << 30), Some(space));
        assert_eq!(capped.bytes, 1536 << 20);
        assert!(capped.limited_by_address_space());
        assert!(
            capped.describe().contains("address-space limit"),
            "{}",
            capped.describe()
        );
        assert!(capped
            .check("x", 2 << 30, "less")
            .unwrap_err()
            .to_string()
            .contains("ulimit -v 3.0 GiB"));
        let given = Budget::under(Some(1 << 30), Some(space));
        assert_eq!(given.bytes, 1 << 30);
        assert_eq!(given.describe(), "--max-memory 1.0 GiB");
        assert_eq!(Budget::under(Some(5), None).bytes, 5);
        assert!(given.check("x", 1 << 30, "less").is_ok());
    }
}
