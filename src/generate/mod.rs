//! Generated test cases shared by cargo-fuzz and proptest (cargo feature
//! `arbitrary`).
//!
//! This module holds generators and the checks that judge them; it does not
//! depend on a fuzzing engine. A [`GeneratedCase`] is drawn from raw bytes
//! through [`arbitrary::Arbitrary`] and is valid by construction: a geometry
//! and one request that kvgeom's connector supports, so every oracle must
//! pass. One case in [`INVALID_ONE_IN`] is deliberately invalid (a broken
//! geometry-file rule or a pair the handshake must refuse) and must be
//! rejected with that error. [`PlanInput`] feeds arbitrary block-id lists to
//! the request planner. The fuzz targets in `fuzz/` and the replay test
//! `tests/connector/regressions.rs` are glue around [`targets`].

mod case;
mod draw;
mod invalid;
pub mod plan;
#[cfg(feature = "proptest")]
pub mod strategy;
pub mod targets;

pub use case::{Expected, Finding, GeneratedCase, INVALID_ONE_IN};
pub use draw::{
    MAX_CASE_BYTES, MAX_CONV_ROWS, MAX_CONV_UNITS, MAX_HEAD_SIZE, MAX_KERNEL_BASE, MAX_LAYER_SLOTS,
    MAX_MAMBA_GROUPS, MAX_PPL, MAX_PROMPT, MAX_SSM_UNITS, MAX_TOKEN_BYTES, MAX_TP,
};
pub use invalid::{BrokenRule, Refusal};
pub use plan::PlanInput;
