//! Why a case could not run as asked: the harness's own errors, reported
//! as the case's `error` outcome (never as the connector's).

/// A prefix hit the case cannot have ([`super::run::check_prefix_hit`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PrefixHitError {
    /// A prompt of no tokens.
    #[error("the prompt length must be at least 1")]
    EmptyPrompt,
    /// A hit on a decode engine that caches no prefixes.
    #[error("prefix hit {hit}: decode.prefix_caching is off, so the only prefix hit is 0")]
    NoPrefixCaching {
        /// The prefix hit, in tokens.
        hit: u32,
        /// The geometry's name.
        geometry: String,
    },
    /// A hit that is not whole decode blocks, or that covers every
    /// transferred token.
    #[error(
        "prefix hit {hit}: must be a multiple of decode.logical_block ({block}) and below the \
         {transferred} transferred tokens"
    )]
    NotWholeBlocks {
        /// The prefix hit, in tokens.
        hit: u32,
        /// Decode's logical block, in tokens.
        block: u32,
        /// Tokens the request transfers.
        transferred: u32,
    },
}

/// Why a VRAM case's device memory could not be set up, written or read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum VramError {
    /// A VRAM case in a build without the `cuda` feature.
    #[cfg(not(feature = "cuda"))]
    #[error(
        "--memory vram needs kvgeom built with `--features cuda` and a CUDA GPU (see docs/gpu.md)"
    )]
    NeedsCuda,
    /// The device did not open.
    #[cfg(feature = "cuda")]
    #[error(transparent)]
    Open(crate::memory::CudaError),
    /// A KV tensor could not be allocated on the device.
    #[cfg(feature = "cuda")]
    #[error("allocating KV tensors on device {ordinal}: {source}")]
    Alloc {
        /// The device.
        ordinal: u32,
        /// What the driver answered.
        #[source]
        source: crate::memory::CudaError,
    },
    /// Copying a host image up to its device tensor failed.
    #[cfg(feature = "cuda")]
    #[error("uploading a KV tensor: {0}")]
    Upload(#[source] crate::memory::CudaError),
    /// Reading a device tensor back into its host image failed.
    #[cfg(feature = "cuda")]
    #[error("reading a KV tensor back: {0}")]
    Download(#[source] crate::memory::CudaError),
    /// The receive post-process failed on the device.
    #[cfg(feature = "cuda")]
    #[error("post-process on the device: {0}")]
    PostProcess(#[source] crate::memory::CudaError),
}

/// Why a case's transport could not be set up.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TransportError {
    /// `--transport nixl` in a build without the `nixl` feature.
    #[cfg(not(feature = "nixl"))]
    #[error(
        "--transport nixl needs kvgeom built with `--features nixl` and the NIXL runtime \
         (scripts/install-nixl-runtime.sh)"
    )]
    NeedsNixl,
    /// Real NIXL did not start (its runtime is missing, or refused).
    #[cfg(feature = "nixl")]
    #[error(transparent)]
    Nixl(#[from] crate::nixl::NixlError),
    /// The case's device memory cannot back a transport.
    #[error(transparent)]
    Vram(#[from] VramError),
}

/// A rank's KV memory that the operating system refused (an address-space
/// limit, no memory left) although the case passed its memory estimate.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "{side} rank {rank}: {source}; the case does not fit in the memory this process may use \
     (lower --max-memory so that the estimate refuses it, or raise the limit)"
)]
pub struct AllocationError {
    /// The engine.
    pub side: crate::layout::Side,
    /// The rank.
    pub rank: u32,
    /// What the operating system refused.
    #[source]
    pub source: crate::memory::AllocError,
}
