//! The input model: layer specs, engine geometry, P/D pairs, and loading
//! geometry files.

pub(crate) mod engine;
pub(crate) mod error;
pub(crate) mod file;
pub(crate) mod file_fields;
pub(crate) mod fixtures;
pub(crate) mod handshake_compat;
pub(crate) mod load;
pub(crate) mod model;
pub(crate) mod pair;
pub(crate) mod sglang_file;
pub mod sglang_state;
#[cfg(test)]
mod sglang_state_tests;
pub(crate) mod stack;
pub(crate) mod validate;

pub use engine::{block_size_ratio, tp_ratio, EngineGeometry};
pub use error::{Engine, GeometryError, Rule, Violation};
pub use file::{parse_geometry, to_toml, to_toml_named_by_path};
pub use handshake_compat::{
    mismatch_text, CompatFactors, EngineCompat, FactorDifference, HandshakeCompat,
};
pub use load::{geometry_files, load_geometries, load_geometry, load_geometry_with, toml_files_in};
pub use model::{AttentionSpec, GroupKind, KvLayout, MambaKind, MambaSpec, ModelSpec, SubRegion};
pub use pair::{ExpectedRejection, Geometry, Mode, PairRatios};
pub use stack::{SglangSpec, Stack};
pub use validate::validate;
