//! Why a derivation fails: bad input (the config file, the options) or a
//! deployment vLLM 0.33.0 itself refuses.

use std::path::PathBuf;

/// A derivation that could not be made. [`DeriveError::is_vllm_refusal`]
/// separates deployments vLLM refuses from input kvgeom cannot read.
#[derive(Debug, thiserror::Error)]
pub enum DeriveError {
    #[error("{}: cannot read the model config: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{source_name}: not a JSON model config: {detail}")]
    Json { source_name: String, detail: String },
    #[error("{source_name}: the model config has no `model_type`")]
    NoModelType { source_name: String },
    #[error(
        "{source_name}: unknown model_type `{model_type}`; supported model types: {}",
        supported.join(", ")
    )]
    UnknownModelType {
        source_name: String,
        model_type: String,
        supported: Vec<&'static str>,
    },
    #[error("{source_name}: `{field}` is missing; {model_type} configs need it ({why})")]
    MissingField {
        source_name: String,
        model_type: String,
        field: String,
        why: &'static str,
    },
    #[error("{source_name}: `{field}` must be {expected}, found {found}")]
    BadField {
        source_name: String,
        field: String,
        expected: &'static str,
        found: String,
    },
    #[error("unknown attention backend `{name}`; supported backends: {}", supported.join(", "))]
    UnknownBackend {
        name: String,
        supported: Vec<&'static str>,
    },
    #[error("unknown GPU `{name}`; supported: sm90 (Hopper), sm100 (Blackwell)")]
    UnknownGpu { name: String },
    #[error("unknown {option} `{name}`; supported: {}", supported.join(", "))]
    UnknownDtype {
        option: &'static str,
        name: String,
        supported: Vec<&'static str>,
    },
    #[error("{option} must be at least 1")]
    ZeroOption { option: &'static str },
    #[error("{0}")]
    Unsupported(String),
    /// vLLM 0.33.0 refuses this deployment; `reason` is vLLM's message.
    #[error("vLLM 0.33.0 refuses this deployment: {reason}")]
    Refused { reason: String },
}

impl DeriveError {
    /// True when vLLM itself would refuse (as opposed to unreadable input).
    pub fn is_vllm_refusal(&self) -> bool {
        matches!(self, DeriveError::Refused { .. })
    }

    pub(crate) fn refused(reason: impl Into<String>) -> Self {
        DeriveError::Refused {
            reason: reason.into(),
        }
    }
}
