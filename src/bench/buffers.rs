//! The KV tensors a replayed request moves between, on host memory or on
//! CUDA device 0 (feature `cuda`), numbered as in its [`RequestPlan`]. A
//! process may own only some of them (a peer process owns the other
//! side's). Sources carry a word pattern keyed by buffer number, so a
//! destination byte from the wrong place is caught; destinations are
//! cleared before each timed run and verified pair by pair after it.

use crate::layout::Side;
use crate::memory::HostArena;
use crate::nixl::{MemKind, MemRegion, XferOp};
use crate::scenario::MemoryKind;

use super::request_plan::{RequestPlan, Row};

/// Why a benchmark buffer could not be allocated, written, read or copied.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BufferError {
    /// A host write past the end of its buffer.
    #[error("{len} bytes at {offset} overrun a {buffer_len}-byte buffer")]
    Overrun {
        /// Bytes written.
        len: usize,
        /// Byte offset of the write in the buffer.
        offset: u64,
        /// The buffer's length in bytes.
        buffer_len: u64,
    },
    /// Device memory was asked of a build without the `cuda` feature.
    #[error("VRAM needs kvgeom built with `--features cuda`")]
    VramNeedsCuda,
    /// The operating system refused a host buffer.
    #[error(transparent)]
    Host(#[from] crate::memory::AllocError),
    /// A copy between host and device memory (only same-kind copies are timed).
    #[error("source and destination are different kinds of memory")]
    MixedKinds,
    /// The CUDA driver refused an allocation, copy or fill.
    #[cfg(feature = "cuda")]
    #[error(transparent)]
    Cuda(#[from] crate::memory::CudaError),
}

/// Why a replay's destinations do not hold their sources' bytes.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    /// A destination could not be read back.
    #[error(transparent)]
    Buffer(#[from] BufferError),
    /// The first pair whose destination bytes are not its source's.
    #[error(
        "transfer {xfer} pair {pair}: {len} bytes at {offset} of {side} rank {rank} region \
         {region} are not the source's"
    )]
    NotTheSource {
        /// The transfer, in plan order.
        xfer: usize,
        /// The pair, in the transfer's order.
        pair: usize,
        /// Bytes of the pair.
        len: u64,
        /// Byte offset of the destination in its buffer.
        offset: u64,
        /// The destination buffer's side.
        side: Side,
        /// The destination buffer's rank.
        rank: u32,
        /// The destination buffer's region.
        region: u32,
    },
}

/// One buffer this process owns.
#[derive(Clone, Debug)]
pub enum Buffer {
    Host(HostArena),
    #[cfg(feature = "cuda")]
    Device(crate::memory::DeviceArena),
}

impl Buffer {
    pub fn base(&self) -> u64 {
        match self {
            Buffer::Host(a) => a.base(),
            #[cfg(feature = "cuda")]
            Buffer::Device(a) => a.base(),
        }
    }

    pub fn len(&self) -> u64 {
        match self {
            Buffer::Host(a) => a.len(),
            #[cfg(feature = "cuda")]
            Buffer::Device(a) => a.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn as_host(&self) -> Option<&HostArena> {
        match self {
            Buffer::Host(a) => Some(a),
            #[cfg(feature = "cuda")]
            Buffer::Device(_) => None,
        }
    }

    #[cfg(feature = "cuda")]
    pub fn as_device(&self) -> Option<&crate::memory::DeviceArena> {
        match self {
            Buffer::Device(a) => Some(a),
            Buffer::Host(_) => None,
        }
    }

    /// The buffer as one NIXL registration.
    pub fn region(&self) -> MemRegion {
        match self {
            Buffer::Host(a) => MemRegion {
                addr: a.base(),
                len: a.len(),
                mem: MemKind::Dram,
                dev: 0,
            },
            #[cfg(feature = "cuda")]
            Buffer::Device(a) => a.region(),
        }
    }

    pub fn write(&self, offset: u64, bytes: &[u8]) -> Result<(), BufferError> {
        match self {
            Buffer::Host(a) => {
                let mut dst = a.write();
                let range = offset as usize..offset as usize + bytes.len();
                match dst.get_mut(range) {
                    Some(dst) => {
                        dst.copy_from_slice(bytes);
                        Ok(())
                    }
                    None => Err(BufferError::Overrun {
                        len: bytes.len(),
                        offset,
                        buffer_len: a.len(),
                    }),
                }
            }
            #[cfg(feature = "cuda")]
            Buffer::Device(a) => Ok(a.write(offset, bytes)?),
        }
    }

    /// The whole content, on the host.
    pub fn snapshot(&self) -> Result<Vec<u8>, BufferError> {
        match self {
            Buffer::Host(a) => Ok(a.snapshot()),
            #[cfg(feature = "cuda")]
            Buffer::Device(a) => Ok(a.snapshot()?),
        }
    }

    pub fn clear(&self) -> Result<(), BufferError> {
        match self {
            Buffer::Host(a) => {
                a.write().fill(0);
                Ok(())
            }
            #[cfg(feature = "cuda")]
            Buffer::Device(a) => Ok(a.fill(0, a.len(), 0)?),
        }
    }
}

/// A new buffer of `len` bytes of the given kind.
pub fn allocate(kind: MemoryKind, len: u64) -> Result<Buffer, BufferError> {
    match kind {
        MemoryKind::Host => Ok(Buffer::Host(HostArena::try_new(len)?)),
        #[cfg(feature = "cuda")]
        MemoryKind::Vram => Ok(crate::memory::CudaDevice::open(
            crate::scenario::vram::DEVICE_ORDINAL,
        )
        .and_then(|d| d.alloc(len))
        .map(Buffer::Device)?),
        #[cfg(not(feature = "cuda"))]
        MemoryKind::Vram => Err(BufferError::VramNeedsCuda),
    }
}

/// splitmix64's finaliser.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The source pattern of buffer `buffer` from byte `offset`, `len` bytes:
/// little-endian words `mix(buffer << 40 ^ word index)`.
pub fn pattern(buffer: usize, offset: u64, len: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(len as usize);
    let seed = (buffer as u64) << 40;
    let mut word = offset / 8;
    let mut skip = (offset % 8) as usize;
    while (out.len() as u64) < len {
        let bytes = mix(seed ^ word).to_le_bytes();
        let take = (8 - skip).min((len - out.len() as u64) as usize);
        out.extend_from_slice(&bytes[skip..skip + take]);
        skip = 0;
        word += 1;
    }
    out
}

/// The buffers of one plan; `None` where another process owns the buffer.
#[derive(Debug)]
pub struct BenchMemory {
    pub kind: MemoryKind,
    pub buffers: Vec<Option<Buffer>>,
}

/// Largest piece of a pattern written at once.
const FILL_CHUNK: u64 = 64 << 20;

impl BenchMemory {
    /// Allocate the buffers of `sides` (zeroed).
    pub fn allocate(
        plan: &RequestPlan,
        kind: MemoryKind,
        sides: &[Side],
    ) -> Result<Self, BufferError> {
        let buffers = plan
            .buffers
            .iter()
            .map(|b| {
                if sides.contains(&b.side) {
                    allocate(kind, b.len).map(Some)
                } else {
                    Ok(None)
                }
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { kind, buffers })
    }

    /// The owned buffers of one side with their plan numbers.
    pub fn owned<'a>(
        &'a self,
        plan: &'a RequestPlan,
        side: Side,
    ) -> impl Iterator<Item = (usize, &'a Buffer)> + 'a {
        plan.buffers_of(side)
            .filter_map(move |i| self.buffers[i].as_ref().map(|b| (i, b)))
    }

    /// Write the source pattern into every owned buffer of `side`.
    pub fn fill(&self, plan: &RequestPlan, side: Side) -> Result<(), BufferError> {
        for (i, b) in self.owned(plan, side) {
            let mut offset = 0;
            while offset < b.len() {
                let len = FILL_CHUNK.min(b.len() - offset);
                b.write(offset, &pattern(i, offset, len))?;
                offset += len;
            }
        }
        Ok(())
    }

    /// Zero every owned buffer of `side`.
    pub fn clear(&self, plan: &RequestPlan, side: Side) -> Result<(), BufferError> {
        self.owned(plan, side).try_for_each(|(_, b)| b.clear())
    }

    /// Check that every destination this process owns holds its source's
    /// pattern after a replay with `op` (READ: decode rows are
    /// destinations; WRITE: prefill rows are).
    pub fn verify(&self, plan: &RequestPlan, op: XferOp) -> Result<(), VerifyError> {
        let mut images: Vec<Option<Vec<u8>>> = vec![None; self.buffers.len()];
        for (x, xfer) in plan.xfers.iter().enumerate() {
            for (pair, (local, remote)) in xfer.pairs().enumerate() {
                let (src, dst): (Row, Row) = match op {
                    XferOp::Read => (remote, local),
                    XferOp::Write => (local, remote),
                };
                let Some(buffer) = &self.buffers[dst.buffer] else {
                    continue;
                };
                if images[dst.buffer].is_none() {
                    images[dst.buffer] = Some(buffer.snapshot()?);
                }
                let image = images[dst.buffer].as_deref().unwrap_or_default();
                let found = image.get(dst.offset as usize..(dst.offset + dst.len) as usize);
                if found != Some(&pattern(src.buffer, src.offset, src.len)[..]) {
                    let b = &plan.buffers[dst.buffer];
                    return Err(VerifyError::NotTheSource {
                        xfer: x,
                        pair,
                        len: dst.len,
                        offset: dst.offset,
                        side: b.side,
                        rank: b.rank,
                        region: b.region,
                    });
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_pieces_join_into_the_whole() {
        let whole = pattern(3, 0, 40);
        assert_eq!(pattern(3, 5, 17), whole[5..22].to_vec());
        assert_eq!(
            pattern(3, 8, 8),
            mix((3u64 << 40) ^ 1).to_le_bytes().to_vec()
        );
        assert_ne!(pattern(4, 0, 40), whole);
        assert!(pattern(3, 7, 0).is_empty());
    }

    #[test]
    fn verify_names_the_first_pair_that_did_not_land() {
        let g = crate::geometry::load_geometry(std::path::Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/geometries/g1-mla-kda-ppl3-vs-2.toml"
        )))
        .unwrap();
        let plan = super::super::request_plan::plan_request(&g, 29).unwrap();
        let memory =
            BenchMemory::allocate(&plan, MemoryKind::Host, &[Side::Prefill, Side::Decode]).unwrap();
        memory.fill(&plan, Side::Prefill).unwrap();
        // Nothing moved: the first READ pair's destination is still zero.
        let e = memory.verify(&plan, XferOp::Read).unwrap_err();
        let (local, _) = plan.xfers[0].pairs().next().unwrap();
        let b = &plan.buffers[local.buffer];
        assert_eq!(
            e,
            VerifyError::NotTheSource {
                xfer: 0,
                pair: 0,
                len: local.len,
                offset: local.offset,
                side: Side::Decode,
                rank: b.rank,
                region: b.region,
            }
        );
        assert_eq!(
            e.to_string(),
            format!(
                "transfer 0 pair 0: {} bytes at {} of decode rank {} region {} are not the \
                 source's",
                local.len, local.offset, b.rank, b.region
            )
        );
        // Moving every pair by hand makes it pass.
        for x in &plan.xfers {
            for (l, r) in x.pairs() {
                let bytes = pattern(r.buffer, r.offset, r.len);
                memory.buffers[l.buffer]
                    .as_ref()
                    .unwrap()
                    .write(l.offset, &bytes)
                    .unwrap();
            }
        }
        assert_eq!(memory.verify(&plan, XferOp::Read), Ok(()));
    }
}
