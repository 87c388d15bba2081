//! The input model: layer specs, engine geometry, P/D pairs, and loading
//! geometry files.

pub mod engine;
pub mod model;
pub mod pair;

pub use engine::{block_size_ratio, tp_ratio, EngineGeometry};
pub use model::{AttentionSpec, GroupKind, KvLayout, MambaKind, MambaSpec, ModelSpec, SubRegion};
pub use pair::{Geometry, Mode, PairRatios};
