//! Host arenas: one heap allocation per KV tensor, shared between the
//! scenario (which fills and inspects it) and the transport (which copies
//! into it). The arena's address is the real address of its bytes, so the
//! same arena can be registered with real NIXL.
//!
//! An arena's initial content may be deferred ([`HostArena::defer_fill`]):
//! the fill runs on the first access through the arena, so an arena nothing
//! reads or writes never has its pages touched, and the operating system
//! never backs them with memory. Whoever hands the raw address to something
//! that bypasses the arena (real NIXL, a device copy) calls
//! [`HostArena::settle`] first.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard, TryLockError};

/// The deferred initial content of an arena: writes the whole arena.
pub type DeferredFill = Box<dyn FnOnce(&mut [u8]) + Send>;

/// Arenas at least this large are anonymous memory mappings of their own,
/// not heap blocks: their pages are zero until written (the allocator's
/// reuse of freed heap memory would clear, and so touch, every page) and go
/// back to the operating system as soon as the arena is dropped.
pub const MAPPED_ARENA_BYTES: u64 = 1 << 20;

/// Where [`HostArena::unbacked`] addresses start: bit 62, above every
/// address a process can map.
const UNBACKED_BASE: u64 = 1 << 62;

/// The operating system refused an arena's memory (an address-space limit,
/// no memory left).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("could not allocate {bytes} bytes of KV memory (the operating system refused the mapping)")]
pub struct AllocError {
    /// The bytes asked for.
    pub bytes: u64,
}

/// An arena's bytes: a heap block, or (large arenas) an anonymous mapping.
pub struct ArenaBytes(Storage);

enum Storage {
    Heap(Box<[u8]>),
    Mapped(memmap2::MmapMut),
}

impl ArenaBytes {
    /// `len` zero bytes; a mapping from [`MAPPED_ARENA_BYTES`] on (falling
    /// back to the heap where the mapping is refused). An allocation the
    /// operating system refuses (an address-space limit, no memory left) is
    /// an error, never an abort.
    pub fn zeroed(len: u64) -> Result<Self, AllocError> {
        let refused = || AllocError { bytes: len };
        let size = usize::try_from(len).map_err(|_| refused())?;
        if len >= MAPPED_ARENA_BYTES {
            if let Ok(map) = memmap2::MmapMut::map_anon(size) {
                // Huge pages where the kernel offers them on request: far
                // fewer page faults when a case fills gigabytes. Only a hint.
                #[cfg(target_os = "linux")]
                let _ = map.advise(memmap2::Advice::HugePage);
                return Ok(ArenaBytes(Storage::Mapped(map)));
            }
        }
        let mut bytes = Vec::new();
        bytes.try_reserve_exact(size).map_err(|_| refused())?;
        bytes.resize(size, 0);
        Ok(ArenaBytes(Storage::Heap(bytes.into_boxed_slice())))
    }

    /// No bytes.
    pub fn empty() -> Self {
        ArenaBytes(Storage::Heap(Box::default()))
    }

    /// The bytes as a vector (a copy, for a mapping).
    pub fn into_vec(self) -> Vec<u8> {
        match self.0 {
            Storage::Heap(b) => b.into_vec(),
            Storage::Mapped(m) => m.to_vec(),
        }
    }
}

impl std::ops::Deref for ArenaBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.0 {
            Storage::Heap(b) => b,
            Storage::Mapped(m) => m,
        }
    }
}

impl std::ops::DerefMut for ArenaBytes {
    fn deref_mut(&mut self) -> &mut [u8] {
        match &mut self.0 {
            Storage::Heap(b) => b,
            Storage::Mapped(m) => m,
        }
    }
}

impl From<Vec<u8>> for ArenaBytes {
    fn from(bytes: Vec<u8>) -> Self {
        ArenaBytes(Storage::Heap(bytes.into_boxed_slice()))
    }
}

impl Clone for ArenaBytes {
    fn clone(&self) -> Self {
        self.to_vec().into()
    }
}

impl PartialEq for ArenaBytes {
    fn eq(&self, other: &Self) -> bool {
        self[..] == other[..]
    }
}

impl Eq for ArenaBytes {}

impl fmt::Debug for ArenaBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.0 {
            Storage::Heap(_) => "heap",
            Storage::Mapped(_) => "mapped",
        };
        write!(f, "ArenaBytes({} bytes, {kind})", self.len())
    }
}

/// A fixed-size, zero-initialised host buffer with a stable address.
#[derive(Clone, Debug)]
pub struct HostArena {
    inner: Arc<Inner>,
}

struct Inner {
    base: u64,
    len: u64,
    bytes: RwLock<ArenaBytes>,
    /// Set while a deferred fill waits for the first access.
    pending: AtomicBool,
    fill: Mutex<Option<DeferredFill>>,
    /// An address without memory ([`HostArena::unbacked`]).
    unbacked: bool,
    /// Set when a transfer over an unbacked arena was attempted.
    unbacked_accessed: AtomicBool,
}

impl fmt::Debug for Inner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Inner")
            .field("base", &self.base)
            .field("len", &self.len)
            .field("pending", &self.pending.load(Ordering::Acquire))
            .finish_non_exhaustive()
    }
}

impl HostArena {
    /// A zeroed arena of `len` bytes (from [`MAPPED_ARENA_BYTES`] on, zero
    /// pages that the operating system backs with memory once written).
    /// Panics where the memory is refused: the harness allocates with
    /// [`try_new`](Self::try_new).
    pub fn new(len: u64) -> Self {
        match Self::try_new(len) {
            Ok(arena) => arena,
            Err(e) => panic!("{e}"),
        }
    }

    /// [`new`](Self::new), or the error where the operating system refuses
    /// the memory.
    pub fn try_new(len: u64) -> Result<Self, AllocError> {
        let bytes = ArenaBytes::zeroed(len)?;
        let base = bytes.as_ptr() as u64;
        Ok(Self::with_bytes(base, len, bytes, false))
    }

    /// An arena of `len` bytes with an address and no memory behind it: for
    /// a rank that registers its memory (addresses and sizes) but that no
    /// transfer reads or writes. Its address lies outside every address a
    /// process can map, its deferred fill never runs, and the loopback
    /// transport refuses any transfer over it (and notes the attempt:
    /// [`unbacked_accessed`](Self::unbacked_accessed)). Reading or writing
    /// its bytes through the arena gives an empty slice.
    pub fn unbacked(len: u64) -> Self {
        // Above every user-space address of x86-64 and AArch64 (at most 57
        // bits); each arena gets its own page-aligned range.
        static NEXT: AtomicU64 = AtomicU64::new(UNBACKED_BASE);
        let span = len.max(1).div_ceil(4096).saturating_mul(4096);
        let base = NEXT.fetch_add(span, Ordering::Relaxed);
        Self::with_bytes(base, len, ArenaBytes::empty(), true)
    }

    fn with_bytes(base: u64, len: u64, bytes: ArenaBytes, unbacked: bool) -> Self {
        Self {
            inner: Arc::new(Inner {
                base,
                len,
                bytes: RwLock::new(bytes),
                pending: AtomicBool::new(false),
                fill: Mutex::new(None),
                unbacked,
                unbacked_accessed: AtomicBool::new(false),
            }),
        }
    }

    /// Whether real memory backs the arena (not [`unbacked`](Self::unbacked)).
    pub fn is_backed(&self) -> bool {
        !self.inner.unbacked
    }

    /// Note that something tried to transfer over an unbacked arena.
    pub fn note_unbacked_access(&self) {
        self.inner.unbacked_accessed.store(true, Ordering::Release);
    }

    /// Whether something tried to transfer over this unbacked arena.
    pub fn unbacked_accessed(&self) -> bool {
        self.inner.unbacked_accessed.load(Ordering::Acquire)
    }

    /// Defer the arena's initial content: `fill` runs once, on the first
    /// read or write through the arena (or [`settle`](Self::settle)), and
    /// never if nothing accesses the arena. Replaces a fill still pending;
    /// on an arena already accessed it runs at once.
    pub fn defer_fill(&self, fill: impl FnOnce(&mut [u8]) + Send + 'static) {
        *self.inner.fill.lock().unwrap_or_else(|e| e.into_inner()) = Some(Box::new(fill));
        self.inner.pending.store(true, Ordering::Release);
    }

    /// Whether a deferred fill still waits: nothing has accessed the arena
    /// since [`defer_fill`](Self::defer_fill).
    pub fn fill_pending(&self) -> bool {
        self.inner.pending.load(Ordering::Acquire)
    }

    /// Run a pending deferred fill now (before the raw address is used by
    /// something that bypasses the arena).
    pub fn settle(&self) {
        drop(self.write());
    }

    /// Runs the pending fill into `bytes` (the caller holds the write lock).
    fn run_fill(&self, bytes: &mut [u8]) {
        // An unbacked arena has no bytes to fill: its fill stays pending.
        if self.inner.unbacked {
            return;
        }
        let fill = self
            .inner
            .fill
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        self.inner.pending.store(false, Ordering::Release);
        if let Some(fill) = fill {
            fill(bytes);
        }
    }

    /// The write guard, with a pending fill run first.
    fn settled_write(&self) -> RwLockWriteGuard<'_, ArenaBytes> {
        let mut guard = self.inner.bytes.write().unwrap_or_else(|e| e.into_inner());
        if self.fill_pending() {
            self.run_fill(&mut guard);
        }
        guard
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

    /// Lock the bytes for reading (a pending fill runs first).
    pub fn read(&self) -> RwLockReadGuard<'_, ArenaBytes> {
        if self.fill_pending() {
            drop(self.settled_write());
        }
        self.inner.bytes.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Lock the bytes for writing (a pending fill runs first).
    pub fn write(&self) -> RwLockWriteGuard<'_, ArenaBytes> {
        self.settled_write()
    }

    /// The bytes for reading, or `None` while a writer holds them (or, with
    /// a fill pending, while any guard does).
    pub fn try_read(&self) -> Option<RwLockReadGuard<'_, ArenaBytes>> {
        if self.fill_pending() {
            drop(self.try_write()?);
        }
        match self.inner.bytes.try_read() {
            Ok(guard) => Some(guard),
            Err(TryLockError::Poisoned(e)) => Some(e.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    /// The bytes for writing, or `None` while any other guard holds them.
    pub fn try_write(&self) -> Option<RwLockWriteGuard<'_, ArenaBytes>> {
        let mut guard = match self.inner.bytes.try_write() {
            Ok(guard) => guard,
            Err(TryLockError::Poisoned(e)) => e.into_inner(),
            Err(TryLockError::WouldBlock) => return None,
        };
        if self.fill_pending() {
            self.run_fill(&mut guard);
        }
        Some(guard)
    }

    /// The content itself (no copy), leaving the arena empty: for the final
    /// image of a finished case, when nothing will read or write the arena again.
    pub fn take_bytes(&self) -> ArenaBytes {
        std::mem::replace(&mut *self.write(), ArenaBytes::empty())
    }

    /// [`take_bytes`](Self::take_bytes), or `None` (and nothing touched)
    /// when a deferred fill is still pending: nothing ever accessed the arena.
    pub fn take_bytes_if_accessed(&self) -> Option<ArenaBytes> {
        let mut guard = self.inner.bytes.write().unwrap_or_else(|e| e.into_inner());
        if self.fill_pending() {
            return None;
        }
        Some(std::mem::replace(&mut *guard, ArenaBytes::empty()))
    }

    /// A copy of the whole content.
    pub fn snapshot(&self) -> Vec<u8> {
        self.read().to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn a_deferred_fill_runs_once_on_the_first_access() {
        let runs = Arc::new(AtomicUsize::new(0));
        let arena = HostArena::new(16);
        let counter = runs.clone();
        arena.defer_fill(move |bytes| {
            counter.fetch_add(1, Ordering::SeqCst);
            bytes.fill(7);
        });
        assert!(arena.fill_pending());
        assert_eq!(runs.load(Ordering::SeqCst), 0, "nothing accessed it yet");
        assert_eq!(arena.read()[3], 7);
        assert!(!arena.fill_pending());
        arena.write()[0] = 1;
        assert_eq!(arena.snapshot()[..2], [1, 7]);
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn every_way_in_runs_the_pending_fill() {
        let ways: [fn(&HostArena) -> u8; 4] = [
            |a| a.read()[0],
            |a| a.write()[0],
            |a| a.try_read().expect("free")[0],
            |a| a.try_write().expect("free")[0],
        ];
        for way in ways {
            let arena = HostArena::new(4);
            arena.defer_fill(|bytes| bytes.fill(9));
            assert_eq!(way(&arena), 9);
        }
        let arena = HostArena::new(4);
        arena.defer_fill(|bytes| bytes.fill(9));
        arena.settle();
        assert!(!arena.fill_pending());
        assert_eq!(arena.take_bytes()[..], [9; 4]);
    }

    #[test]
    fn a_large_arena_is_a_mapping_of_zero_pages() {
        let arena = HostArena::new(MAPPED_ARENA_BYTES);
        assert!(arena.read().iter().all(|&b| b == 0));
        arena.write()[5] = 3;
        let bytes = arena.take_bytes();
        assert!(format!("{bytes:?}").contains("mapped"), "{bytes:?}");
        assert_eq!((bytes.len() as u64, bytes[5]), (MAPPED_ARENA_BYTES, 3));
        assert_eq!(bytes.clone(), bytes);
        assert!(arena.is_empty() || arena.read().is_empty());
    }

    #[test]
    fn memory_the_system_refuses_is_an_error() {
        let e = HostArena::try_new(u64::MAX / 2).unwrap_err();
        assert_eq!(e.bytes, u64::MAX / 2);
        assert!(e.to_string().starts_with("could not allocate "), "{e}");
    }

    #[test]
    fn an_unbacked_arena_has_an_address_and_no_memory() {
        let (a, b) = (HostArena::unbacked(5000), HostArena::unbacked(1 << 40));
        assert!(!a.is_backed() && !b.is_backed() && HostArena::new(4).is_backed());
        assert!(a.base() >= UNBACKED_BASE && b.base() >= a.base() + 8192);
        assert_eq!((a.len(), b.len()), (5000, 1 << 40));
        a.defer_fill(|bytes| bytes.fill(1));
        assert!(a.read().is_empty());
        assert!(a.fill_pending(), "its fill never runs");
        assert_eq!(a.take_bytes_if_accessed(), None);
        assert!(!a.unbacked_accessed());
        a.note_unbacked_access();
        assert!(a.unbacked_accessed());
    }

    #[test]
    fn an_arena_nothing_accessed_gives_no_image() {
        let arena = HostArena::new(8);
        arena.defer_fill(|bytes| bytes.fill(1));
        assert_eq!(arena.take_bytes_if_accessed(), None);
        assert!(arena.fill_pending(), "asking does not run the fill");
        drop(arena.read());
        assert_eq!(arena.take_bytes_if_accessed(), Some(vec![1; 8].into()));
    }
}
