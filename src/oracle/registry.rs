//! The one table of oracles: name, level and check. The scenario runs every
//! row; `check-trace` runs the descriptor-level rows (and the byte-level ones
//! when a trace carries memory). A test holds that each row is failed by at
//! least one known defect variant.

use super::{
    containment, coverage, neighbour_preservation, no_double_write, pairing, transferred_or_zeroed,
    OracleInput, Violation,
};

/// What an oracle needs to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OracleLevel {
    /// Only the layouts and the resolved descriptor pairs.
    Descriptor,
    /// Memory images of both engines and the provenance pattern as well.
    Byte,
}

/// One oracle.
#[derive(Clone, Copy, Debug)]
pub struct Oracle {
    /// The name every violation of this oracle carries.
    pub name: &'static str,
    /// Whether it reads descriptors only (also on traces) or memory images.
    pub level: OracleLevel,
    /// The invariant, in one line.
    pub invariant: &'static str,
    /// The check: every violation it finds in one case.
    pub check: fn(&OracleInput) -> Vec<Violation>,
}

/// Every oracle, in the order they run.
pub static ORACLES: [Oracle; 6] = [
    Oracle {
        name: containment::NAME,
        level: OracleLevel::Descriptor,
        invariant: "every byte a transfer touches lies in the request's own blocks",
        check: containment::check,
    },
    Oracle {
        name: pairing::NAME,
        level: OracleLevel::Descriptor,
        invariant: "each pair has equal length, kind and region and starts at the same token or state slice",
        check: pairing::check,
    },
    Oracle {
        name: coverage::NAME,
        level: OracleLevel::Descriptor,
        invariant: "every transferred token and every needed state slice is moved",
        check: coverage::check,
    },
    Oracle {
        name: no_double_write::NAME,
        level: OracleLevel::Descriptor,
        invariant: "no local byte is written by two descriptors of one request",
        check: no_double_write::check,
    },
    Oracle {
        name: transferred_or_zeroed::NAME,
        level: OracleLevel::Byte,
        invariant: "every byte of the request's attention blocks holds prefill's byte for its token, or zero",
        check: transferred_or_zeroed::check,
    },
    Oracle {
        name: neighbour_preservation::NAME,
        level: OracleLevel::Byte,
        invariant: "bytes outside the request's blocks are unchanged",
        check: neighbour_preservation::check,
    },
];

/// The oracle of a name.
pub fn by_name(name: &str) -> Option<&'static Oracle> {
    ORACLES.iter().find(|o| o.name == name)
}

/// Run the oracles that `filter` selects, in table order.
pub fn run_where(input: &OracleInput, filter: impl Fn(&Oracle) -> bool) -> Vec<Violation> {
    ORACLES
        .iter()
        .filter(|o| filter(o))
        .flat_map(|o| (o.check)(input))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_resolve() {
        for (i, o) in ORACLES.iter().enumerate() {
            assert_eq!(by_name(o.name).map(|f| f.name), Some(o.name));
            assert!(ORACLES[i + 1..].iter().all(|p| p.name != o.name));
        }
        assert!(by_name("no-such-oracle").is_none());
    }
}
