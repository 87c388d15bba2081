//! The shared block pools of both engines and who owns each block: every
//! block is owned by one request or free. Each engine has a pool of
//! attention blocks and, for mamba models, a pool of state slots, laid out
//! in one host arena per engine that the transport moves bytes in.
//! Allocation hands out the most recently freed block first, so that a
//! freed block is the next one a new request gets (the worst case for a
//! late write, and what a prefix cache's eviction does to an idle block).

use serde::{Deserialize, Serialize};

use crate::memory::HostArena;

use super::operation::{Engine, RequestId};
use super::shape::{LifecycleShape, STATE_BYTES};

/// What a block holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockKind {
    /// Attention KV of a run of tokens.
    Attention,
    /// One request's mamba state.
    State,
}

/// One block of one engine's pools.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct BlockRef {
    /// The engine.
    pub engine: Engine,
    /// Its pool.
    pub kind: BlockKind,
    /// Its index in the pool.
    pub index: u32,
}

impl std::fmt::Display for BlockRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let e = match self.engine {
            Engine::Prefill => 'P',
            Engine::Decode => 'D',
        };
        let k = match self.kind {
            BlockKind::Attention => "",
            BlockKind::State => "s",
        };
        write!(f, "{e}{k}{}", self.index)
    }
}

/// One pool: an owner (or none) per block and the free list.
#[derive(Clone, Debug)]
struct Pool {
    owner: Vec<Option<RequestId>>,
    /// Free blocks; the last is handed out first.
    free: Vec<u32>,
}

impl Pool {
    fn new(blocks: u32) -> Self {
        Pool {
            owner: vec![None; blocks as usize],
            free: (0..blocks).rev().collect(),
        }
    }
}

/// Both engines' pools and their memory.
#[derive(Debug)]
pub struct Pools {
    shape: LifecycleShape,
    pools: [[Pool; 2]; 2],
    arenas: [HostArena; 2],
}

fn engine_slot(engine: Engine) -> usize {
    match engine {
        Engine::Prefill => 0,
        Engine::Decode => 1,
    }
}

fn kind_slot(kind: BlockKind) -> usize {
    match kind {
        BlockKind::Attention => 0,
        BlockKind::State => 1,
    }
}

impl Pools {
    /// Pools for `requests` requests of `shape`, every block free.
    pub fn new(shape: &LifecycleShape, requests: u32) -> Self {
        let states = if shape.has_state { requests } else { 0 };
        let make = |engine| {
            let attention = shape.pool_blocks(engine, requests);
            let pools = [Pool::new(attention), Pool::new(states)];
            let bytes = u64::from(attention) * shape.block_bytes(engine)
                + u64::from(states) * u64::from(STATE_BYTES);
            (pools, HostArena::new(bytes.max(1)))
        };
        let (p_pools, p_arena) = make(Engine::Prefill);
        let (d_pools, d_arena) = make(Engine::Decode);
        Pools {
            shape: shape.clone(),
            pools: [p_pools, d_pools],
            arenas: [p_arena, d_arena],
        }
    }

    /// The arena holding `engine`'s blocks.
    pub fn arena(&self, engine: Engine) -> &HostArena {
        &self.arenas[engine_slot(engine)]
    }

    /// The owner of `block`, if it is not free.
    pub fn owner(&self, block: BlockRef) -> Option<RequestId> {
        self.pools[engine_slot(block.engine)][kind_slot(block.kind)]
            .owner
            .get(block.index as usize)
            .copied()
            .flatten()
    }

    /// Blocks in `engine`'s pool of `kind`.
    pub fn len(&self, engine: Engine, kind: BlockKind) -> u32 {
        self.pools[engine_slot(engine)][kind_slot(kind)].owner.len() as u32
    }

    /// `n` free blocks of `kind` given to `request`, or `None` (nothing
    /// changes) when fewer are free.
    pub fn allocate(
        &mut self,
        engine: Engine,
        kind: BlockKind,
        n: u32,
        request: RequestId,
    ) -> Option<Vec<BlockRef>> {
        let pool = &mut self.pools[engine_slot(engine)][kind_slot(kind)];
        if pool.free.len() < n as usize {
            return None;
        }
        let mut out = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let index = pool.free.pop()?;
            pool.owner[index as usize] = Some(request);
            out.push(BlockRef {
                engine,
                kind,
                index,
            });
        }
        Some(out)
    }

    /// Give `block` back to its pool; returns its owner before (`None`: it
    /// was free already, and nothing changes).
    pub fn free(&mut self, block: BlockRef) -> Option<RequestId> {
        let pool = &mut self.pools[engine_slot(block.engine)][kind_slot(block.kind)];
        let owner = pool.owner.get_mut(block.index as usize)?.take()?;
        pool.free.push(block.index);
        Some(owner)
    }

    /// Byte offset of `block` in its engine's arena, and its length.
    pub fn span(&self, block: BlockRef) -> (u64, u64) {
        let bytes = self.shape.block_bytes(block.engine);
        match block.kind {
            BlockKind::Attention => (u64::from(block.index) * bytes, bytes),
            BlockKind::State => {
                let attention = u64::from(self.len(block.engine, BlockKind::Attention));
                (
                    attention * bytes + u64::from(block.index) * u64::from(STATE_BYTES),
                    u64::from(STATE_BYTES),
                )
            }
        }
    }

    /// The block of `engine` holding byte `offset` of its arena.
    pub fn block_at(&self, engine: Engine, offset: u64) -> Option<BlockRef> {
        let bytes = self.shape.block_bytes(engine);
        let attention = u64::from(self.len(engine, BlockKind::Attention));
        if offset < attention * bytes {
            return Some(BlockRef {
                engine,
                kind: BlockKind::Attention,
                index: (offset / bytes) as u32,
            });
        }
        let index = (offset - attention * bytes) / u64::from(STATE_BYTES);
        (index < u64::from(self.len(engine, BlockKind::State))).then_some(BlockRef {
            engine,
            kind: BlockKind::State,
            index: index as u32,
        })
    }

    /// Every block and its owner, engine by engine and pool by pool.
    pub fn ownership(&self) -> Vec<(BlockRef, Option<RequestId>)> {
        let mut out = Vec::new();
        for engine in [Engine::Prefill, Engine::Decode] {
            for kind in [BlockKind::Attention, BlockKind::State] {
                let pool = &self.pools[engine_slot(engine)][kind_slot(kind)];
                for (i, o) in pool.owner.iter().enumerate() {
                    out.push((
                        BlockRef {
                            engine,
                            kind,
                            index: i as u32,
                        },
                        *o,
                    ));
                }
            }
        }
        out
    }

    /// Write `bytes` at `offset` of `engine`'s arena.
    pub fn write(&self, engine: Engine, offset: u64, bytes: &[u8]) {
        let mut arena = self.arena(engine).write();
        let at = offset as usize;
        arena[at..at + bytes.len()].copy_from_slice(bytes);
    }

    /// Fill `len` bytes at `offset` of `engine`'s arena with `byte`.
    pub fn fill(&self, engine: Engine, offset: u64, len: u64, byte: u8) {
        let mut arena = self.arena(engine).write();
        let at = offset as usize;
        arena[at..at + len as usize].fill(byte);
    }

    /// A copy of `len` bytes at `offset` of `engine`'s arena.
    pub fn read(&self, engine: Engine, offset: u64, len: u64) -> Vec<u8> {
        let arena = self.arena(engine).read();
        let at = offset as usize;
        arena[at..at + len as usize].to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> LifecycleShape {
        LifecycleShape {
            name: "t".into(),
            prefill_block_tokens: 4,
            decode_block_tokens: 8,
            has_state: true,
            prompts: vec![9],
            prefix_caching: false,
        }
    }

    #[test]
    fn a_freed_block_is_the_next_one_handed_out() {
        let mut pools = Pools::new(&shape(), 2);
        let a = pools
            .allocate(Engine::Decode, BlockKind::Attention, 2, 0)
            .unwrap();
        assert_eq!(pools.free(a[1]), Some(0));
        assert_eq!(
            pools.free(a[1]),
            None,
            "freeing a free block changes nothing"
        );
        let b = pools
            .allocate(Engine::Decode, BlockKind::Attention, 1, 1)
            .unwrap();
        assert_eq!(b[0], a[1]);
        assert_eq!(pools.owner(b[0]), Some(1));
    }

    #[test]
    fn spans_map_back_to_their_blocks() {
        let pools = Pools::new(&shape(), 3);
        for (block, _) in pools.ownership() {
            let (at, len) = pools.span(block);
            assert_eq!(pools.block_at(block.engine, at), Some(block));
            assert_eq!(pools.block_at(block.engine, at + len - 1), Some(block));
        }
        assert!(pools.len(Engine::Prefill, BlockKind::Attention) == 9);
    }
}
