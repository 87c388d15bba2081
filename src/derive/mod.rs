//! Deriving block geometry from a real deployment: a model's HF config, each
//! engine's TP size and attention backend, and the cache options, as a vLLM
//! release computes them (`kvgeom derive`; 0.33.0's rules unless
//! `--release` names another).
//!
//! - [`rules`]: what differs between the releases derived for
//! - [`hf_config`]: reading `config.json`
//! - [`families`]: what each supported model family's config says
//! - [`attention`], [`mamba_state`]: one rank's sizes
//! - [`backend`]: kernel block sizes, the selector's checks, `select_common_block_size`
//! - [`block_size`]: the hybrid alignment of the logical block
//! - [`engine`]: one engine end to end
//! - [`pair`]: a P/D pair as a geometry file
//! - [`geometry_file`]: geometry files that name `model.hf_config`
//! - [`sglang_model`], [`sglang_engine`], [`sglang_pair`]: the same under
//!   SGLang 0.5.23's rules (`--stack sglang`): a config's layers, heads and
//!   linear state, one engine's ranks, a pair as an SGLang geometry file

pub(crate) mod attention;
pub(crate) mod backend;
pub(crate) mod block_size;
pub(crate) mod dtype;
pub(crate) mod engine;
pub(crate) mod error;
pub(crate) mod families;
pub(crate) mod geometry_file;
pub(crate) mod hf_config;
pub(crate) mod mamba_state;
pub(crate) mod pair;
pub(crate) mod rules;
pub(crate) mod sglang_engine;
pub(crate) mod sglang_model;
pub(crate) mod sglang_pair;

pub use backend::{Backend, Gpu};
pub use dtype::{CacheDtype, Dtype, MambaDtype};
pub use engine::{derive_engine, EngineDerivation, EngineOptions};
pub use error::DeriveError;
pub use families::{Family, ModelArch};
pub use geometry_file::{
    load_geometry_file, load_geometry_file_with_source, parse_geometry_file, ModelSource,
};
pub use hf_config::HfConfig;
pub use pair::{
    derive_pair, layer_groups, layer_groups_of, LayerGroups, PairDerivation, PairOptions,
};
pub use rules::{VllmRules, VLLM_RULES};
pub use sglang_engine::{derive_sglang_engine, SglangEngine};
pub use sglang_model::SglangModel;
pub use sglang_pair::{derive_sglang_pair, SglangPair, SglangPairOptions};

/// Read a config file and the model it describes.
pub fn load_model(path: &std::path::Path) -> Result<ModelArch, DeriveError> {
    ModelArch::from_config(&HfConfig::load(path)?)
}

/// Read a config file and the model SGLang 0.5.23 builds from it.
pub fn load_sglang_model(path: &std::path::Path) -> Result<SglangModel, DeriveError> {
    SglangModel::from_config(&HfConfig::load(path)?)
}
