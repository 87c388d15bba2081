//! The harness's own model of KV memory: where every byte of every engine,
//! TP rank and region belongs, independent of the connector's code.
//!
//! [`EngineLayout`] describes one rank of one engine (geometry only);
//! [`CaseLayout`] adds the request's block lists for both engines and
//! classifies descriptor rows into [`Location`]s (it implements
//! [`crate::nixl::recording::Classify`]). Every byte of a request block maps
//! to a TP-independent [`Coordinate`], which the provenance pattern hashes.

pub(crate) mod case;
pub(crate) mod coordinate;
pub(crate) mod engine;
pub(crate) mod error;
pub(crate) mod location;
mod shape;

pub use case::{CaseLayout, Owner, RequestBlocks};
pub use coordinate::Coordinate;
pub use engine::{EngineLayout, HeadSlice, MambaPage, PageView};
pub use error::LayoutError;
pub use location::{
    AttentionSpan, CellOrder, Location, LocationKind, MambaPart, MambaPiece, MambaSpan, SpanShape,
};

use serde::{Deserialize, Serialize};

/// Which engine a rank belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Side {
    /// The prefill engine (P), which holds the prompt's KV.
    Prefill,
    /// The decode engine (D), which receives it.
    Decode,
}

impl Side {
    /// `prefill` or `decode`, as reports and file names spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Side::Prefill => "prefill",
            Side::Decode => "decode",
        }
    }

    /// The geometry's engine of this side.
    pub fn engine(self) -> crate::geometry::Engine {
        match self {
            Side::Prefill => crate::geometry::Engine::Prefill,
            Side::Decode => crate::geometry::Engine::Decode,
        }
    }

    /// The NIXL agent name of this side's worker on `rank`: `prefill-<rank>` or `decode-<rank>`.
    pub fn agent_name(self, rank: u32) -> String {
        format!("{}-{rank}", self.as_str())
    }

    /// Parses an agent name of the form `prefill-<rank>` or `decode-<rank>`.
    pub fn parse_agent_name(name: &str) -> Option<(Side, u32)> {
        // A rank holds no '-', so the side is everything before the last one.
        let (side, rank) = if let Some(rank) = name.strip_prefix("prefill-") {
            (Side::Prefill, rank)
        } else {
            (Side::Decode, name.strip_prefix("decode-")?)
        };
        Some((side, rank.parse().ok()?))
    }
}

impl std::fmt::Display for Side {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Classifier tests; their case builders are shared with `pattern`'s tests.
#[cfg(test)]
pub(crate) mod classifier_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_names_round_trip() {
        assert_eq!(Side::Decode.agent_name(3), "decode-3");
        assert_eq!(
            Side::parse_agent_name("prefill-12"),
            Some((Side::Prefill, 12))
        );
        assert_eq!(Side::parse_agent_name("remote-agent"), None);
        assert_eq!(Side::parse_agent_name("decode-x"), None);
    }
}
