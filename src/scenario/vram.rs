//! `--memory vram`: every rank's KV tensors live on CUDA device 0, mirrored
//! by the host arenas the rest of the scenario works with. The pattern fill
//! writes the host images and uploads them; the connector registers,
//! transfers and post-processes the device buffers (the post-process as GPU
//! work); once the request is done the device bytes are read back into the
//! host images for the oracles.
//!
//! Without the `cuda` cargo feature a VRAM case is a harness error, so
//! `kvgeom sweep --memory vram` exits 2 with the reason.

use crate::connector::post_process::{GroupPostProcess, PageGeometry};
use crate::connector::KvMemory;
use crate::memory::{HostArena, HostTensors};
use crate::nixl::Nixl;

use super::case::TransportKind;
#[cfg(feature = "cuda")]
use super::device_tensors::DeviceTensors;
use super::error::{TransportError, VramError};

/// The device every VRAM case runs on.
pub const DEVICE_ORDINAL: u32 = 0;

/// One rank's device tensors (one buffer per region, same sizes as its
/// host arenas).
#[cfg(feature = "cuda")]
#[derive(Clone, Debug)]
pub struct RankDevice {
    arenas: Vec<crate::memory::DeviceArena>,
}

/// One rank's device tensors: none can exist without the `cuda` feature.
#[cfg(not(feature = "cuda"))]
#[derive(Clone, Debug)]
pub enum RankDevice {}

/// The device tensors of both engines of a case, rank by rank.
#[derive(Clone, Debug)]
pub struct CaseDevices {
    pub prefill: Vec<RankDevice>,
    pub decode: Vec<RankDevice>,
}

#[cfg(feature = "cuda")]
impl RankDevice {
    /// Allocate a device buffer for each of `host`'s arenas.
    fn mirror(host: &[HostArena]) -> Result<Self, VramError> {
        let device = crate::memory::CudaDevice::open(DEVICE_ORDINAL).map_err(VramError::Open)?;
        let arenas = host
            .iter()
            .map(|a| device.alloc(a.len()))
            .collect::<Result<_, _>>()
            .map_err(|source| VramError::Alloc {
                ordinal: DEVICE_ORDINAL,
                source,
            })?;
        Ok(Self { arenas })
    }

    /// `(base, len)` of each device tensor, in region order.
    pub fn tensors(&self) -> Vec<(u64, u64)> {
        self.arenas.iter().map(|a| (a.base(), a.len())).collect()
    }

    /// Copy the host images up.
    pub fn upload(&self, host: &[HostArena]) -> Result<(), VramError> {
        for (d, h) in self.arenas.iter().zip(host) {
            d.write(0, &h.read()).map_err(VramError::Upload)?;
        }
        Ok(())
    }

    /// Copy the device bytes back into the host images.
    pub fn download(&self, host: &[HostArena]) -> Result<(), VramError> {
        for (d, h) in self.arenas.iter().zip(host) {
            d.read_into(0, &mut h.write())
                .map_err(VramError::Download)?;
        }
        Ok(())
    }
}

#[cfg(not(feature = "cuda"))]
impl RankDevice {
    pub fn tensors(&self) -> Vec<(u64, u64)> {
        match *self {}
    }

    pub fn upload(&self, _host: &[HostArena]) -> Result<(), VramError> {
        match *self {}
    }

    pub fn download(&self, _host: &[HostArena]) -> Result<(), VramError> {
        match *self {}
    }
}

/// Device mirrors of every rank's host arenas.
#[cfg(feature = "cuda")]
pub fn mirror(
    prefill: &[Vec<HostArena>],
    decode: &[Vec<HostArena>],
) -> Result<CaseDevices, VramError> {
    let side = |ranks: &[Vec<HostArena>]| {
        ranks
            .iter()
            .map(|r| RankDevice::mirror(r))
            .collect::<Result<Vec<_>, _>>()
    };
    Ok(CaseDevices {
        prefill: side(prefill)?,
        decode: side(decode)?,
    })
}

#[cfg(not(feature = "cuda"))]
pub fn mirror(
    _prefill: &[Vec<HostArena>],
    _decode: &[Vec<HostArena>],
) -> Result<CaseDevices, VramError> {
    Err(VramError::NeedsCuda)
}

/// A transport that moves bytes between the case's device buffers.
#[cfg(feature = "cuda")]
pub fn transport(
    kind: TransportKind,
    devices: &CaseDevices,
) -> Result<Box<dyn Nixl>, TransportError> {
    let arenas = || {
        devices
            .prefill
            .iter()
            .chain(&devices.decode)
            .flat_map(|r| r.arenas.iter().cloned())
    };
    match kind {
        TransportKind::Loopback => {
            let mut lb = crate::nixl::Loopback::new();
            arenas().for_each(|a| lb.attach_device(a));
            Ok(Box::new(lb))
        }
        #[cfg(feature = "nixl")]
        TransportKind::Nixl => {
            let mut nixl = crate::nixl::real::RealNixl::new()?;
            arenas().for_each(|a| nixl.attach_device(a));
            Ok(Box::new(nixl))
        }
        #[cfg(not(feature = "nixl"))]
        TransportKind::Nixl => Err(TransportError::NeedsNixl),
    }
}

#[cfg(not(feature = "cuda"))]
pub fn transport(
    _kind: TransportKind,
    devices: &CaseDevices,
) -> Result<Box<dyn Nixl>, TransportError> {
    match devices.prefill.first().or(devices.decode.first()) {
        Some(d) => match *d {},
        None => Err(VramError::NeedsCuda.into()),
    }
}

/// The memory a rank's receive post-process runs on: its host arenas, or
/// its device tensors (post-processed on the GPU).
pub enum RankMemory {
    Host(HostTensors),
    #[cfg(feature = "cuda")]
    Device(DeviceTensors),
}

impl RankMemory {
    /// A rank's memory: its host `arenas`, or its `device` tensors if it has them.
    pub fn new(arenas: &[HostArena], device: Option<&RankDevice>) -> Self {
        match device {
            None => RankMemory::Host(HostTensors(arenas.to_vec())),
            #[cfg(feature = "cuda")]
            Some(d) => RankMemory::Device(DeviceTensors::new(d.arenas.clone())),
            #[cfg(not(feature = "cuda"))]
            Some(d) => match *d {},
        }
    }

    /// The first device error of the post-process, if any.
    pub fn error(&self) -> Option<VramError> {
        match self {
            RankMemory::Host(_) => None,
            #[cfg(feature = "cuda")]
            RankMemory::Device(d) => d.error().map(VramError::PostProcess),
        }
    }

    fn inner(&mut self) -> &mut dyn KvMemory {
        match self {
            RankMemory::Host(h) => h,
            #[cfg(feature = "cuda")]
            RankMemory::Device(d) => d,
        }
    }
}

impl KvMemory for RankMemory {
    fn read(&self, region: usize, offset: u64, len: u64) -> Vec<u8> {
        match self {
            RankMemory::Host(h) => h.read(region, offset, len),
            #[cfg(feature = "cuda")]
            RankMemory::Device(d) => d.read(region, offset, len),
        }
    }

    fn write(&mut self, region: usize, offset: u64, bytes: &[u8]) {
        self.inner().write(region, offset, bytes);
    }

    fn zero(&mut self, region: usize, offset: u64, len: u64) {
        self.inner().zero(region, offset, len);
    }

    fn post_process(&mut self, plans: &[GroupPostProcess], geometries: &[PageGeometry]) {
        self.inner().post_process(plans, geometries);
    }
}
