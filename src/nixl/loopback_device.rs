//! The loopback transport's device memory: CUDA buffers given to
//! `Loopback::attach_device` (cargo feature `cuda`), where VRAM may be
//! registered and between which a transfer moves bytes with ordered
//! device-to-device copies, waited for before `post_xfer` returns.
//! Without the feature no device memory can be attached and every VRAM
//! request is [`NixlError::Unsupported`].

use super::{NixlError, NixlResult};

/// A byte position inside one attached device buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct DevicePlace {
    pub arena: usize,
    pub offset: u64,
}

/// One resolved VRAM descriptor pair: `len` bytes from `src` to `dst`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct DeviceCopy {
    pub src: DevicePlace,
    pub dst: DevicePlace,
    pub len: u64,
}

/// Why VRAM cannot be used, for `Unsupported` errors.
pub(super) fn no_device_memory() -> &'static str {
    if cfg!(feature = "cuda") {
        "no device memory is attached to this loopback transport (Loopback::attach_device)"
    } else {
        "the loopback transport moves host memory only in builds without the `cuda` feature"
    }
}

#[cfg(feature = "cuda")]
mod space {
    use super::*;
    use crate::memory::DeviceArena;

    /// The attached device buffers, in attachment order.
    #[derive(Clone, Debug, Default)]
    pub(in crate::nixl) struct DeviceSpace {
        arenas: Vec<DeviceArena>,
    }

    impl DeviceSpace {
        /// Attaching the same buffer twice has no effect.
        pub fn attach(&mut self, arena: DeviceArena) {
            if !self.arenas.iter().any(|a| a.same_as(&arena)) {
                self.arenas.push(arena);
            }
        }

        pub fn is_empty(&self) -> bool {
            self.arenas.is_empty()
        }

        /// Where `[addr, addr + len)` of device `dev` lies, if inside one buffer.
        pub fn resolve(&self, dev: u32, addr: u64, len: u64) -> Option<DevicePlace> {
            self.arenas
                .iter()
                .position(|a| a.device().ordinal() == dev && a.contains(addr, len))
                .map(|arena| DevicePlace {
                    arena,
                    offset: addr - self.arenas[arena].base(),
                })
        }

        /// Copy every pair in order, then wait for the copies.
        pub fn run(&self, copies: &[DeviceCopy]) -> NixlResult<()> {
            let Some(first) = copies.first() else {
                return Ok(());
            };
            let backend = |e: crate::memory::CudaError| NixlError::Backend(e.to_string());
            let device = self.arenas[first.src.arena].device();
            let mut queue = device.queue();
            for c in copies {
                let (Some(src), Some(dst)) =
                    (self.arenas.get(c.src.arena), self.arenas.get(c.dst.arena))
                else {
                    return Err(NixlError::Backend(format!(
                        "internal: device copy between buffers {} and {} of {}",
                        c.src.arena,
                        c.dst.arena,
                        self.arenas.len()
                    )));
                };
                queue
                    .copy(src, c.src.offset, dst, c.dst.offset, c.len)
                    .map_err(backend)?;
            }
            queue.finish().map_err(backend)
        }
    }
}

#[cfg(not(feature = "cuda"))]
mod space {
    use super::*;

    /// No device memory without the `cuda` feature.
    #[derive(Clone, Debug, Default)]
    pub(in crate::nixl) struct DeviceSpace;

    impl DeviceSpace {
        pub fn is_empty(&self) -> bool {
            true
        }

        pub fn resolve(&self, _dev: u32, _addr: u64, _len: u64) -> Option<DevicePlace> {
            None
        }

        pub fn run(&self, copies: &[DeviceCopy]) -> NixlResult<()> {
            if copies.is_empty() {
                Ok(())
            } else {
                Err(NixlError::Unsupported(no_device_memory().into()))
            }
        }
    }
}

pub(super) use space::DeviceSpace;
