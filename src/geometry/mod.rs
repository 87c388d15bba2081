//! The input model: layer specs, engine geometry, P/D pairs, and loading
//! geometry files.

pub mod engine;
pub mod error;
pub mod file;
pub mod fixtures;
pub mod load;
pub mod model;
pub mod pair;
pub mod validate;

pub use engine::{block_size_ratio, tp_ratio, EngineGeometry};
pub use error::{Engine, GeometryError, Rule, Violation};
pub use file::{parse_geometry, to_toml};
pub use load::{load_geometries, load_geometry, load_geometry_with, toml_files_in};
pub use model::{AttentionSpec, GroupKind, KvLayout, MambaKind, MambaSpec, ModelSpec, SubRegion};
pub use pair::{Geometry, Mode, PairRatios};
pub use validate::validate;
