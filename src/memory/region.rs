//! Where KV memory lives, as NIXL registers it: the memory kind and one
//! registered address range. The NIXL layer re-exports both
//! (`nixl::{MemKind, MemRegion}`).

use serde::{Deserialize, Serialize};

/// NIXL memory type of a list or a registration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum MemKind {
    /// Host memory.
    Dram,
    /// GPU memory.
    Vram,
}

/// One memory registration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MemRegion {
    /// Start address of the region.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// Host or device memory.
    pub mem: MemKind,
    /// Device ordinal (0 for host memory).
    pub dev: u32,
}

impl std::fmt::Display for MemRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:?} region {:#x}+{} (dev {})",
            self.mem, self.addr, self.len, self.dev
        )
    }
}
