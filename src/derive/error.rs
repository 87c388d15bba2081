//! Why a derivation fails: bad input (the config file, the options) or a
//! deployment the vLLM release itself refuses.

use std::path::PathBuf;

/// A derivation that could not be made. [`DeriveError::is_vllm_refusal`]
/// separates deployments vLLM refuses from input kvgeom cannot read.
#[derive(Debug, thiserror::Error)]
pub enum DeriveError {
    /// The config file could not be read.
    #[error("{}: cannot read the model config: {source}", path.display())]
    Read {
        /// The config file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The config is not JSON, or its top level is not an object.
    #[error("{source_name}: not a JSON model config: {detail}")]
    Json {
        /// Where the config came from (its path).
        source_name: String,
        /// The parser's message.
        detail: String,
    },
    /// The config has no `model_type`, or it is not a non-empty string.
    #[error("{source_name}: the model config has no `model_type`")]
    NoModelType {
        /// Where the config came from (its path).
        source_name: String,
    },
    /// The config's `model_type` is not one of the supported families.
    #[error(
        "{source_name}: unknown model_type `{model_type}`; supported model types: {}",
        supported.join(", ")
    )]
    UnknownModelType {
        /// Where the config came from (its path).
        source_name: String,
        /// The `model_type` the config names.
        model_type: String,
        /// `model_type (models)` of every supported family.
        supported: Vec<&'static str>,
    },
    /// A field the family needs is absent (or JSON `null`).
    #[error("{source_name}: `{field}` is missing; {model_type} configs need it ({why})")]
    MissingField {
        /// Where the config came from (its path, and the nested table if any).
        source_name: String,
        /// The config's `model_type`.
        model_type: String,
        /// The missing field's name.
        field: String,
        /// What the field decides (e.g. "the layer count").
        why: &'static str,
    },
    /// A field is present but of the wrong type or out of range.
    #[error("{source_name}: `{field}` must be {expected}, found {found}")]
    BadField {
        /// Where the config came from (its path, and the nested table if any).
        source_name: String,
        /// The field's name.
        field: String,
        /// What the field must be (e.g. "a positive integer").
        expected: &'static str,
        /// The JSON value found.
        found: String,
    },
    /// A backend option's value names no backend kvgeom knows.
    #[error("unknown attention backend `{name}`; supported backends: {}", supported.join(", "))]
    UnknownBackend {
        /// The name given.
        name: String,
        /// vLLM's names of every supported backend.
        supported: Vec<&'static str>,
    },
    /// A GPU option's value names no supported GPU generation.
    #[error("unknown GPU `{name}`; supported: sm90 (Hopper), sm100 (Blackwell)")]
    UnknownGpu {
        /// The name given.
        name: String,
    },
    /// A dtype option's value is not one it accepts.
    #[error("unknown {option} `{name}`; supported: {}", supported.join(", "))]
    UnknownDtype {
        /// The option (e.g. `--cache-dtype`).
        option: &'static str,
        /// The value given.
        name: String,
        /// The values the option accepts.
        supported: Vec<&'static str>,
    },
    /// A count option (`--tp`, `--block-size`, `--layer-slots`) is 0.
    #[error("{option} 0: must be at least 1")]
    ZeroOption {
        /// The option.
        option: &'static str,
    },
    /// A request kvgeom does not model or cannot state as a geometry file (an
    /// fp8 cache on MLA, engines that disagree on the model, a value too
    /// large for the format), a command line of no known shape, or output
    /// that cannot be written; the message says which.
    #[error("{0}")]
    Unsupported(String),
    /// The config's family has no model in SGLang 0.5.23 (`--stack sglang`).
    #[error(
        "{source_name}: SGLang 0.5.23 has no model for model_type `{model_type}` ({models}); \
         supported with --stack sglang: {}",
        supported.join(", ")
    )]
    NotInSglang {
        /// Where the config came from (its path).
        source_name: String,
        /// The config's `model_type`.
        model_type: String,
        /// The family's models, for the message.
        models: &'static str,
        /// `model_type (models)` of every family SGLang runs.
        supported: Vec<&'static str>,
    },
    /// An option that only vLLM's derivation takes was given with `--stack sglang`.
    #[error("{option} is an option of vLLM's derivation; --stack sglang does not take it")]
    NotAnSglangOption {
        /// The option.
        option: &'static str,
    },
    /// SGLang 0.5.23 cannot build this deployment; `reason` says why.
    #[error("SGLang 0.5.23 refuses this deployment: {reason}")]
    SglangRefused {
        /// What SGLang's code asserts.
        reason: String,
    },
    /// The vLLM release refuses this deployment; `reason` is vLLM's message.
    #[error("vLLM {release} refuses this deployment: {reason}")]
    Refused {
        /// The release whose rules refused it.
        release: &'static str,
        /// vLLM's message.
        reason: String,
    },
}

impl DeriveError {
    /// True when vLLM itself would refuse (as opposed to unreadable input).
    pub fn is_vllm_refusal(&self) -> bool {
        matches!(self, DeriveError::Refused { .. })
    }

    /// vLLM's refusal, under the pinned release's rules until
    /// [`DeriveError::in_release`] names the release derived for.
    pub(crate) fn refused(reason: impl Into<String>) -> Self {
        DeriveError::Refused {
            release: super::rules::VllmRules::pinned().release,
            reason: reason.into(),
        }
    }

    /// A refusal names `release`, the release whose rules were applied.
    pub(crate) fn in_release(self, release: &'static str) -> Self {
        match self {
            DeriveError::Refused { reason, .. } => DeriveError::Refused { release, reason },
            other => other,
        }
    }
}
