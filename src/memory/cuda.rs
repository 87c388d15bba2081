//! CUDA device memory (cargo feature `cuda`) through cudarc's driver API:
//! plain `cuMemAlloc` allocations on one device (NIXL can register them and
//! UCX can export them through CUDA IPC, which it cannot do for
//! stream-ordered pool memory), uploads of host images, read-backs, and
//! ordered device-to-device copies and memsets on the calling thread's
//! stream.
//!
//! cudarc loads `libcuda.so.1` at run time and panics where it is missing;
//! [`CudaDevice::open`] checks for it first and returns
//! [`CudaError::DriverMissing`] instead. Every range is checked against its
//! allocation before a driver call, so a bad offset is a typed error, never
//! a stray device write. This file holds the crate's `unsafe` CUDA calls.

use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::result::{self, DriverError};
use cudarc::driver::sys::{self, CUdeviceptr, CUstream};
use cudarc::driver::CudaContext;

use super::region::{MemKind, MemRegion};

/// The driver library's soname, the one UCX's CUDA modules link; cudarc
/// tries it last ([`super::cuda_driver::candidates`]).
pub const DRIVER_LIBRARY: &str = "libcuda.so.1";

/// `CU_STREAM_PER_THREAD`: each host thread's own default stream, so that
/// parallel sweep workers never wait for each other's copies.
fn per_thread_stream() -> CUstream {
    0x2 as CUstream
}

/// Why a CUDA operation failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CudaError {
    #[error(
        "no CUDA driver: none of the libraries cudarc tries could be loaded ({}); install the \
         NVIDIA driver (it provides {DRIVER_LIBRARY}), or run on a machine with a GPU",
        super::cuda_driver::candidates_text()
    )]
    DriverMissing,
    /// cuInit answered CUDA_ERROR_STUB_LIBRARY: the library loaded is the
    /// toolkit's link-time stub, not the driver.
    #[error(
        "the CUDA library loaded is a stub, not the driver: {library} (cuInit: \
         CUDA_ERROR_STUB_LIBRARY); cudarc tries libcuda.so before {DRIVER_LIBRARY}, so take the \
         stub's folder off LD_LIBRARY_PATH or install the NVIDIA driver"
    )]
    StubDriver { library: String },
    #[error("CUDA device {ordinal} does not exist: the driver sees {count} device(s)")]
    NoDevice { ordinal: u32, count: i32 },
    #[error("CUDA {what} failed: {message}")]
    Driver { what: String, message: String },
    #[error("{what}: {offset}+{len} lies outside the {size}-byte device allocation at {base:#x}")]
    OutOfRange {
        what: &'static str,
        base: u64,
        offset: u64,
        len: u64,
        size: u64,
    },
    #[error("cannot allocate an empty device buffer")]
    EmptyAllocation,
    #[error("{what}: the two buffers live on different devices ({src} and {dst})")]
    DeviceMismatch {
        what: &'static str,
        src: u32,
        dst: u32,
    },
}

fn driver(what: impl Into<String>) -> impl FnOnce(DriverError) -> CudaError {
    let what = what.into();
    move |e| CudaError::Driver {
        what,
        message: format!("{e}"),
    }
}

fn to_usize(v: u64) -> Result<usize, CudaError> {
    usize::try_from(v).map_err(|_| CudaError::Driver {
        what: "size conversion".into(),
        message: format!("{v} bytes exceed the address space"),
    })
}

/// One CUDA device and its primary context, shared by every buffer on it.
#[derive(Clone, Debug)]
pub struct CudaDevice {
    ctx: Arc<CudaContext>,
    ordinal: u32,
}

/// Devices opened so far; their primary contexts live as long as the
/// process, so buffers, streams and UCX's own CUDA state never see the
/// context torn down and rebuilt between sweep cases.
fn opened() -> &'static Mutex<Vec<CudaDevice>> {
    static OPENED: OnceLock<Mutex<Vec<CudaDevice>>> = OnceLock::new();
    OPENED.get_or_init(|| Mutex::new(Vec::new()))
}

/// Whether the driver library can be loaded (no CUDA call is made).
pub fn driver_present() -> bool {
    // SAFETY: `is_culib_present` only tries to dlopen the driver library by
    // its usual names and drops the handle; it calls no CUDA function.
    unsafe { sys::is_culib_present() }
}

impl CudaDevice {
    /// Open device `ordinal` (its primary context), or explain why not.
    pub fn open(ordinal: u32) -> Result<Self, CudaError> {
        let mut opened = opened().lock().unwrap_or_else(|e| e.into_inner());
        if let Some(device) = opened.iter().find(|d| d.ordinal == ordinal) {
            return Ok(device.clone());
        }
        if !driver_present() {
            return Err(CudaError::DriverMissing);
        }
        let count = CudaContext::device_count().map_err(|e| {
            if e.0 == sys::cudaError_enum::CUDA_ERROR_STUB_LIBRARY {
                CudaError::StubDriver {
                    library: super::cuda_driver::loaded_library_text(),
                }
            } else {
                driver("initialising the driver")(e)
            }
        })?;
        if i64::from(ordinal) >= i64::from(count) {
            return Err(CudaError::NoDevice { ordinal, count });
        }
        let index = usize::try_from(ordinal).map_err(|_| CudaError::NoDevice { ordinal, count })?;
        let ctx = CudaContext::new(index).map_err(driver(format!("opening device {ordinal}")))?;
        let device = CudaDevice { ctx, ordinal };
        opened.push(device.clone());
        Ok(device)
    }

    pub fn ordinal(&self) -> u32 {
        self.ordinal
    }

    /// The device's name as the driver reports it.
    pub fn name(&self) -> Result<String, CudaError> {
        self.ctx.name().map_err(driver("reading the device name"))
    }

    /// Make the device's context current on the calling thread (cheap when
    /// it already is). Every operation here does it first.
    pub fn bind(&self) -> Result<(), CudaError> {
        self.ctx.bind_to_thread().map_err(driver(format!(
            "binding device {} to this thread",
            self.ordinal
        )))
    }

    /// A zero-filled buffer of `len` bytes from a plain `cuMemAlloc`.
    pub fn alloc(&self, len: u64) -> Result<DeviceArena, CudaError> {
        if len == 0 {
            return Err(CudaError::EmptyAllocation);
        }
        let bytes = to_usize(len)?;
        self.bind()?;
        // SAFETY: the context is current on this thread; the returned
        // pointer is owned by the `Allocation` below, which frees it once.
        let ptr = unsafe { result::malloc_sync(bytes) }.map_err(driver(format!(
            "allocating {len} bytes on device {}",
            self.ordinal
        )))?;
        let arena = DeviceArena {
            inner: Arc::new(Allocation {
                device: self.clone(),
                ptr,
                len,
            }),
        };
        arena.fill(0, len, 0)?;
        Ok(arena)
    }

    /// Ordered asynchronous work on this thread's stream.
    pub fn queue(&self) -> DeviceQueue {
        DeviceQueue {
            device: self.clone(),
            keep: Vec::new(),
            pending: false,
        }
    }

    /// Wait for everything this thread queued on the device.
    pub fn synchronize_thread(&self) -> Result<(), CudaError> {
        self.bind()?;
        // SAFETY: the per-thread stream always exists once a context is current.
        unsafe { result::stream::synchronize(per_thread_stream()) }
            .map_err(driver("waiting for this thread's stream"))
    }
}

#[derive(Debug)]
struct Allocation {
    device: CudaDevice,
    ptr: CUdeviceptr,
    len: u64,
}

impl Drop for Allocation {
    fn drop(&mut self) {
        // Nothing to report to in a destructor: a failure here leaks the
        // buffer until the process ends, which is harmless.
        if self.device.bind().is_ok() {
            // SAFETY: `ptr` came from `malloc_sync` in this context and is
            // freed exactly once, here. `cuMemFree` waits for work still
            // using it; every `DeviceQueue` keeps its buffers alive until it
            // has synchronized anyway.
            let _ = unsafe { result::free_sync(self.ptr) };
        }
    }
}

/// A device buffer with a stable address; clones share it, the last one
/// frees it.
#[derive(Clone, Debug)]
pub struct DeviceArena {
    inner: Arc<Allocation>,
}

impl DeviceArena {
    /// Device address of the first byte.
    pub fn base(&self) -> u64 {
        self.inner.ptr
    }

    pub fn len(&self) -> u64 {
        self.inner.len
    }

    pub fn is_empty(&self) -> bool {
        self.inner.len == 0
    }

    pub fn device(&self) -> &CudaDevice {
        &self.inner.device
    }

    /// Whether `[addr, addr + len)` lies inside this buffer.
    pub fn contains(&self, addr: u64, len: u64) -> bool {
        addr >= self.base()
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= self.base() + self.len())
    }

    pub fn same_as(&self, other: &DeviceArena) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// The buffer as one NIXL VRAM registration.
    pub fn region(&self) -> MemRegion {
        MemRegion {
            addr: self.base(),
            len: self.len(),
            mem: MemKind::Vram,
            dev: self.inner.device.ordinal,
        }
    }

    /// Device pointer of `[offset, offset + len)`, checked.
    fn span(&self, what: &'static str, offset: u64, len: u64) -> Result<CUdeviceptr, CudaError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len() => Ok(self.base() + offset),
            _ => Err(CudaError::OutOfRange {
                what,
                base: self.base(),
                offset,
                len,
                size: self.len(),
            }),
        }
    }

    /// Copy `bytes` to `offset`.
    pub fn write(&self, offset: u64, bytes: &[u8]) -> Result<(), CudaError> {
        let dst = self.span("upload", offset, bytes.len() as u64)?;
        if bytes.is_empty() {
            return Ok(());
        }
        self.device().bind()?;
        // SAFETY: `dst..dst + bytes.len()` lies inside this live allocation
        // (checked by `span`); the copy is synchronous, so `bytes` outlives it.
        unsafe { result::memcpy_htod_sync(dst, bytes) }.map_err(driver("host-to-device copy"))?;
        // From pageable memory the call may return once the bytes are
        // staged; wait for them to land, since NIXL/UCX read device memory
        // on streams that do not order after the legacy stream.
        // SAFETY: the legacy default stream (null) always exists.
        unsafe { result::stream::synchronize(std::ptr::null_mut()) }
            .map_err(driver("waiting for a host-to-device copy"))
    }

    /// Copy `out.len()` bytes at `offset` into `out`.
    pub fn read_into(&self, offset: u64, out: &mut [u8]) -> Result<(), CudaError> {
        let src = self.span("read-back", offset, out.len() as u64)?;
        if out.is_empty() {
            return Ok(());
        }
        self.device().bind()?;
        // Work queued on this thread's stream must land before reading.
        self.device().synchronize_thread()?;
        // SAFETY: `src..src + out.len()` lies inside this live allocation;
        // the copy is synchronous and writes only `out`.
        unsafe { result::memcpy_dtoh_sync(out, src) }.map_err(driver("device-to-host copy"))
    }

    /// `len` bytes at `offset`, copied to the host.
    pub fn read(&self, offset: u64, len: u64) -> Result<Vec<u8>, CudaError> {
        let mut out = vec![0u8; to_usize(len)?];
        self.read_into(offset, &mut out)?;
        Ok(out)
    }

    /// The whole buffer, copied to the host.
    pub fn snapshot(&self) -> Result<Vec<u8>, CudaError> {
        self.read(0, self.len())
    }

    /// Set `len` bytes at `offset` to `byte` (synchronously).
    pub fn fill(&self, offset: u64, len: u64, byte: u8) -> Result<(), CudaError> {
        let mut queue = self.device().queue();
        queue.fill(self, offset, len, byte)?;
        queue.finish()
    }
}

/// Device work queued in order on the calling thread's stream. The queue
/// keeps every buffer it touched alive until [`DeviceQueue::finish`] (or
/// its drop) has waited for the work.
#[derive(Debug)]
pub struct DeviceQueue {
    device: CudaDevice,
    keep: Vec<DeviceArena>,
    pending: bool,
}

impl DeviceQueue {
    fn hold(&mut self, arena: &DeviceArena) {
        if !self.keep.iter().any(|a| a.same_as(arena)) {
            self.keep.push(arena.clone());
        }
    }

    fn same_device(&self, what: &'static str, arena: &DeviceArena) -> Result<(), CudaError> {
        if arena.device().ordinal == self.device.ordinal {
            Ok(())
        } else {
            Err(CudaError::DeviceMismatch {
                what,
                src: arena.device().ordinal,
                dst: self.device.ordinal,
            })
        }
    }

    /// Queue a copy of `len` bytes from `src` at `src_offset` to `dst` at
    /// `dst_offset`. Overlapping ranges of one buffer go through a
    /// temporary buffer, so the result is always that of a `memmove`.
    pub fn copy(
        &mut self,
        src: &DeviceArena,
        src_offset: u64,
        dst: &DeviceArena,
        dst_offset: u64,
        len: u64,
    ) -> Result<(), CudaError> {
        self.same_device("device-to-device copy", src)?;
        self.same_device("device-to-device copy", dst)?;
        let from = src.span("copy source", src_offset, len)?;
        let to = dst.span("copy destination", dst_offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let overlaps = src.same_as(dst) && from < to + len && to < from + len;
        if overlaps && from != to {
            let staging = self.device.alloc(len)?;
            self.copy(src, src_offset, &staging, 0, len)?;
            return self.copy(&staging, 0, dst, dst_offset, len);
        }
        if from == to && src.same_as(dst) {
            return Ok(());
        }
        self.hold(src);
        self.hold(dst);
        self.device.bind()?;
        self.pending = true;
        // SAFETY: both ranges lie inside live allocations of this device
        // (checked above, kept alive by `keep` until the stream is waited
        // for) and do not overlap; the context is current.
        unsafe { result::memcpy_dtod_async(to, from, to_usize(len)?, per_thread_stream()) }
            .map_err(driver("device-to-device copy"))
    }

    /// Queue setting `len` bytes of `dst` at `offset` to `byte`.
    pub fn fill(
        &mut self,
        dst: &DeviceArena,
        offset: u64,
        len: u64,
        byte: u8,
    ) -> Result<(), CudaError> {
        self.same_device("memset", dst)?;
        let to = dst.span("memset", offset, len)?;
        if len == 0 {
            return Ok(());
        }
        self.hold(dst);
        self.device.bind()?;
        self.pending = true;
        // SAFETY: the range lies inside a live allocation of this device,
        // kept alive until the stream is waited for; the context is current.
        unsafe { result::memset_d8_async(to, byte, to_usize(len)?, per_thread_stream()) }
            .map_err(driver("memset"))
    }

    /// Queue zeroing `len` bytes of `dst` at `offset`.
    pub fn zero(&mut self, dst: &DeviceArena, offset: u64, len: u64) -> Result<(), CudaError> {
        self.fill(dst, offset, len, 0)
    }

    /// Wait until every queued operation is done.
    pub fn finish(mut self) -> Result<(), CudaError> {
        self.wait()
    }

    fn wait(&mut self) -> Result<(), CudaError> {
        if !self.pending {
            return Ok(());
        }
        self.pending = false;
        let done = self.device.synchronize_thread();
        self.keep.clear();
        done
    }
}

impl Drop for DeviceQueue {
    fn drop(&mut self) {
        // An abandoned queue (an error part way) still waits for what it
        // queued before releasing the buffers; the error was reported already.
        let _ = self.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_machine_without_the_driver_gets_a_typed_error() {
        if driver_present() {
            return; // covered by tests/gpu.rs on a GPU machine
        }
        let e = CudaDevice::open(0).unwrap_err();
        assert_eq!(e, CudaError::DriverMissing);
        let text = e.to_string();
        assert!(
            text.starts_with(
                "no CUDA driver: none of the libraries cudarc tries could be loaded (libcuda.so, "
            ) && text.contains("libcuda.so.1, then the same names for nvcuda); install the NVIDIA"),
            "{text}"
        );
    }
}
