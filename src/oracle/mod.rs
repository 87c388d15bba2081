//! The invariants, one file each. An oracle reads an [`OracleInput`] and
//! returns [`Violation`]s; it never prints.
//!
//! Descriptor-level oracles ([`run_descriptor_level`]) need only the layouts
//! and the resolved pairs, so they also run on recorded vLLM traces; the
//! byte-level ones need memory images and the provenance pattern of
//! [`crate::pattern`].
//!
//! A scenario builds a [`crate::layout::CaseLayout`] from the region bases it
//! allocated, defers each rank's [`crate::pattern::InitialFill`] to the
//! first access of its memory, runs the connector through
//! [`crate::nixl::Recording`] and the receive post-process, resolves the
//! pairs with `recording.resolve(&case)`, and hands [`OracleInput::new`]
//! plus, per rank, [`OracleInput::set_memory`] (the final images, and the
//! initial fill to recompute) or [`OracleInput::set_untouched`] (nothing
//! accessed the rank) to [`run_all`].

pub mod containment;
pub mod coverage;
pub(crate) mod input;
mod intervals;
mod memory;
pub mod neighbour_preservation;
pub mod no_double_write;
pub mod pairing;
pub(crate) mod registry;
pub mod transferred_or_zeroed;
pub(crate) mod violation;

#[cfg(test)]
mod test_case;

pub use input::{BeforeImage, Endpoint, MemoryImages, OracleInput, OraclePair, RankMemory};
pub use registry::{by_name, Oracle, OracleLevel, ORACLES};
pub use violation::{PairRef, Violation};

/// Every oracle of [`ORACLES`].
pub fn run_all(input: &OracleInput) -> Vec<Violation> {
    registry::run_where(input, |_| true)
}

/// The oracles that need no memory (descriptor level).
pub fn run_descriptor_level(input: &OracleInput) -> Vec<Violation> {
    registry::run_where(input, |o| o.level == OracleLevel::Descriptor)
}
