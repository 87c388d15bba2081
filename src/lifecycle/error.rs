//! Why a lifecycle run could not be made: bad input, a geometry whose
//! lifecycle kvgeom does not model, or a failure of the harness itself
//! (never a verdict on the connector).

/// A lifecycle run that could not be made.
#[derive(Debug, thiserror::Error)]
pub enum LifecycleError {
    /// The geometry has no lifecycle kvgeom models.
    #[error("{geometry}: not modelled: {reason}")]
    NotModelled {
        /// The geometry's name.
        geometry: String,
        /// Why.
        reason: String,
    },
    /// The harness itself failed (memory, the transport): no verdict.
    #[error("harness error: {0}")]
    Harness(String),
}

impl From<crate::nixl::NixlError> for LifecycleError {
    fn from(e: crate::nixl::NixlError) -> Self {
        LifecycleError::Harness(e.to_string())
    }
}
