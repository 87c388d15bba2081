//! KV backing memory: host arenas, and CUDA device arenas behind the `cuda`
//! feature, with the memory kind and region NIXL registers them as. A leaf:
//! it imports no other kvgeom module.

#[cfg(feature = "cuda")]
#[allow(missing_docs)]
pub mod cuda;
#[cfg(feature = "cuda")]
pub mod cuda_driver;
pub(crate) mod host;
pub(crate) mod region;

#[cfg(feature = "cuda")]
pub use cuda::{CudaDevice, CudaError, DeviceArena, DeviceQueue};
pub use host::{AllocError, ArenaBytes, HostArena, MAPPED_ARENA_BYTES};
pub use region::{MemKind, MemRegion};

/// A worker's host tensors, in region order. The connector's post-process
/// reaches them through `connector::KvMemory`.
#[derive(Clone, Debug, Default)]
pub struct HostTensors(pub Vec<HostArena>);
