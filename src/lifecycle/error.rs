//! Why a lifecycle run could not be made: bad input, a geometry whose
//! lifecycle kvgeom does not model, a connector that runs no scenario, or a
//! failure of the harness itself (never a verdict on the connector).

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
    /// The connector under test runs no scenario of several requests.
    #[error("{reason}")]
    NoLifecycle {
        /// Why it has none.
        reason: &'static str,
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
