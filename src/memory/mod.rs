//! KV backing memory: host arenas, and CUDA device arenas behind the `cuda`
//! feature.

#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(feature = "cuda")]
pub mod cuda_driver;
#[cfg(feature = "cuda")]
pub mod device_tensors;
pub mod host;

#[cfg(feature = "cuda")]
pub use cuda::{CudaDevice, CudaError, DeviceArena, DeviceQueue};
#[cfg(feature = "cuda")]
pub use device_tensors::DeviceTensors;
pub use host::HostArena;

use crate::connector::post_process::{self, GroupPostProcess, PageGeometry};

/// Byte access to one worker's KV tensors (one per region), used by the
/// connector's receive post-process. Host arenas implement it here; device
/// memory implements it behind the `cuda` feature.
pub trait KvMemory {
    /// Copy `len` bytes at `offset` of tensor `region`.
    fn read(&self, region: usize, offset: u64, len: u64) -> Vec<u8>;
    fn write(&mut self, region: usize, offset: u64, bytes: &[u8]);
    fn zero(&mut self, region: usize, offset: u64, len: u64);

    /// Run a planned receive post-process over these tensors. The default
    /// goes through `read`/`write`/`zero`; device memory overrides it to
    /// run the whole post-process as ordered GPU work.
    fn post_process(&mut self, plans: &[GroupPostProcess], geometries: &[PageGeometry]) {
        post_process::apply_bytes(plans, geometries, self);
    }
}

/// A worker's host tensors, in region order.
#[derive(Clone, Debug, Default)]
pub struct HostTensors(pub Vec<HostArena>);

impl KvMemory for HostTensors {
    fn read(&self, region: usize, offset: u64, len: u64) -> Vec<u8> {
        let bytes = self.0[region].read();
        bytes[offset as usize..(offset + len) as usize].to_vec()
    }

    fn write(&mut self, region: usize, offset: u64, data: &[u8]) {
        let mut bytes = self.0[region].write();
        bytes[offset as usize..offset as usize + data.len()].copy_from_slice(data);
    }

    fn zero(&mut self, region: usize, offset: u64, len: u64) {
        let mut bytes = self.0[region].write();
        bytes[offset as usize..(offset + len) as usize].fill(0);
    }
}
