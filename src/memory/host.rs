//! Host arenas: one heap allocation per KV tensor, shared between the
//! scenario (which fills and inspects it) and the transport (which copies
//! into it). The arena's address is the real address of its bytes, so the
//! same arena can be registered with real NIXL.

use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard, TryLockError};

/// A fixed-size, zero-initialised host buffer with a stable address.
#[derive(Clone, Debug)]
pub struct HostArena {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    base: u64,
    len: u64,
    bytes: RwLock<Box<[u8]>>,
}

impl HostArena {
    /// A zeroed arena of `len` bytes.
    pub fn new(len: u64) -> Self {
        let bytes = vec![0u8; len as usize].into_boxed_slice();
        let base = bytes.as_ptr() as u64;
        Self {
            inner: Arc::new(Inner {
                base,
                len,
                bytes: RwLock::new(bytes),
            }),
        }
    }

    /// Address of the first byte (stable for the arena's lifetime).
    pub fn base(&self) -> u64 {
        self.inner.base
    }

    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.inner.len
    }

    /// Whether the arena has no bytes.
    pub fn is_empty(&self) -> bool {
        self.inner.len == 0
    }

    /// Whether `[addr, addr + len)` lies inside this arena.
    pub fn contains(&self, addr: u64, len: u64) -> bool {
        addr >= self.base()
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= self.base() + self.len())
    }

    /// Whether both handles share the same bytes (clones of one arena).
    pub fn same_as(&self, other: &HostArena) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Lock the bytes for reading.
    pub fn read(&self) -> RwLockReadGuard<'_, Box<[u8]>> {
        self.inner.bytes.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Lock the bytes for writing.
    pub fn write(&self) -> RwLockWriteGuard<'_, Box<[u8]>> {
        self.inner.bytes.write().unwrap_or_else(|e| e.into_inner())
    }

    /// The bytes for reading, or `None` while a writer holds them.
    pub fn try_read(&self) -> Option<RwLockReadGuard<'_, Box<[u8]>>> {
        match self.inner.bytes.try_read() {
            Ok(guard) => Some(guard),
            Err(TryLockError::Poisoned(e)) => Some(e.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    /// The bytes for writing, or `None` while any other guard holds them.
    pub fn try_write(&self) -> Option<RwLockWriteGuard<'_, Box<[u8]>>> {
        match self.inner.bytes.try_write() {
            Ok(guard) => Some(guard),
            Err(TryLockError::Poisoned(e)) => Some(e.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    /// The content itself, leaving the arena empty: for the final image of a
    /// finished case, when nothing will read or write the arena again.
    pub fn take_bytes(&self) -> Vec<u8> {
        std::mem::take(&mut *self.write()).into_vec()
    }

    /// A copy of the whole content.
    pub fn snapshot(&self) -> Vec<u8> {
        self.read().to_vec()
    }
}
