//! A worker's KV tensors on a CUDA device (cargo feature `cuda`), as the
//! connector's receive post-process sees them: [`KvMemory`] over one
//! [`DeviceArena`] per region. The post-process runs as ordered GPU work
//! (the program of [`crate::connector::post_process_lowering`]: staging
//! copies and memsets on the calling thread's stream), not byte range by
//! byte range through the host.
//!
//! [`KvMemory`] has no error channel, so the first CUDA error is kept
//! ("sticky", as CUDA's own errors are) and later operations are skipped;
//! the caller asks [`DeviceTensors::error`] once the post-process is done.
//!
//! This lives in the harness, not in `memory`: running the connector's
//! program needs both the connector and the device, and `memory` is a leaf.

use std::cell::RefCell;

use crate::connector::post_process::{GroupPostProcess, PageGeometry};
use crate::connector::post_process_lowering::{lower, DeviceOp, DeviceProgram};
use crate::connector::KvMemory;
use crate::memory::{CudaError, DeviceArena};

/// One device buffer per region, with the first error seen.
#[derive(Clone, Debug)]
pub struct DeviceTensors {
    arenas: Vec<DeviceArena>,
    error: RefCell<Option<CudaError>>,
}

impl DeviceTensors {
    /// The tensors of one rank, one arena per region.
    pub fn new(arenas: Vec<DeviceArena>) -> Self {
        Self {
            arenas,
            error: RefCell::new(None),
        }
    }

    /// The arenas, in region order.
    pub fn arenas(&self) -> &[DeviceArena] {
        &self.arenas
    }

    /// The first error any operation hit, if any.
    pub fn error(&self) -> Option<CudaError> {
        self.error.borrow().clone()
    }

    fn failed(&self) -> bool {
        self.error.borrow().is_some()
    }

    fn arena(&self, region: usize) -> Result<&DeviceArena, CudaError> {
        self.arenas.get(region).ok_or_else(|| CudaError::Driver {
            what: format!("post-process of region {region}"),
            message: format!("only {} device tensors exist", self.arenas.len()),
        })
    }

    fn record<T>(&self, result: Result<T, CudaError>) -> Option<T> {
        match result {
            Ok(value) => Some(value),
            Err(e) => {
                self.error.borrow_mut().get_or_insert(e);
                None
            }
        }
    }

    /// Run a lowered post-process on the device, in program order.
    pub fn run(&self, program: &DeviceProgram) -> Result<(), CudaError> {
        let Some(first) = self.arenas.first() else {
            return Ok(());
        };
        let device = first.device();
        let staging = match program.staging_bytes {
            0 => None,
            bytes => Some(device.alloc(bytes)?),
        };
        let staging_arena = || {
            staging.as_ref().ok_or_else(|| CudaError::Driver {
                what: "post-process".into(),
                message: "a staging copy without a staging buffer".into(),
            })
        };
        let mut queue = device.queue();
        for op in &program.ops {
            match *op {
                DeviceOp::Stage {
                    region,
                    offset,
                    len,
                } => queue.copy(self.arena(region)?, offset, staging_arena()?, 0, len)?,
                DeviceOp::Unstage {
                    region,
                    from,
                    offset,
                    len,
                } => queue.copy(staging_arena()?, from, self.arena(region)?, offset, len)?,
                DeviceOp::Zero {
                    region,
                    offset,
                    len,
                } => queue.zero(self.arena(region)?, offset, len)?,
            }
        }
        queue.finish()
    }
}

impl KvMemory for DeviceTensors {
    fn read(&self, region: usize, offset: u64, len: u64) -> Vec<u8> {
        let bytes = if self.failed() {
            None
        } else {
            self.record(self.arena(region).and_then(|a| a.read(offset, len)))
        };
        bytes.unwrap_or_else(|| vec![0; len as usize])
    }

    fn write(&mut self, region: usize, offset: u64, bytes: &[u8]) {
        if !self.failed() {
            self.record(self.arena(region).and_then(|a| a.write(offset, bytes)));
        }
    }

    fn zero(&mut self, region: usize, offset: u64, len: u64) {
        if !self.failed() {
            self.record(self.arena(region).and_then(|a| a.fill(offset, len, 0)));
        }
    }

    fn post_process(&mut self, plans: &[GroupPostProcess], geometries: &[PageGeometry]) {
        if !self.failed() {
            self.record(self.run(&lower(plans, geometries)));
        }
    }
}
