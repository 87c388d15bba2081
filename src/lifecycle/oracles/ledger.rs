//! The oracles' own account of the scenario, built from the record alone:
//! who owns each block, each request's prompt and decode blocks, the pairs
//! in flight.

use std::collections::HashMap;

use crate::lifecycle::operation::{Engine, RequestId};
use crate::lifecycle::pools::{BlockKind, BlockRef, Pools};
use crate::lifecycle::record::{Event, PairSpan, Span};

/// A request as the record describes it.
#[derive(Clone, Debug, Default)]
pub struct RequestInfo {
    /// Prompt tokens.
    pub prompt: u32,
    /// Decode blocks its prefix cache held.
    pub prefix_hit_blocks: u32,
    /// Decode's attention blocks, by position.
    pub decode_blocks: Vec<BlockRef>,
    /// Decode's state slot.
    pub decode_state: Option<BlockRef>,
}

/// Ownership and requests, event by event.
#[derive(Clone, Debug, Default)]
pub struct Ledger {
    owners: HashMap<BlockRef, RequestId>,
    /// Requests by id.
    pub requests: Vec<RequestInfo>,
    /// Pairs posted and not landed.
    pub in_flight: Vec<PairSpan>,
}

impl Ledger {
    /// The owner of `block`, if any.
    pub fn owner(&self, block: BlockRef) -> Option<RequestId> {
        self.owners.get(&block).copied()
    }

    /// Blocks owned by anyone, sorted.
    pub fn owned(&self) -> Vec<(BlockRef, RequestId)> {
        let mut v: Vec<_> = self.owners.iter().map(|(b, r)| (*b, *r)).collect();
        v.sort_unstable();
        v
    }

    /// Take `event` into account.
    pub fn apply(&mut self, event: &Event) {
        match event {
            Event::Submitted {
                request,
                prompt,
                prefix_hit_blocks,
            } => {
                let at = *request as usize;
                if self.requests.len() <= at {
                    self.requests.resize(at + 1, RequestInfo::default());
                }
                self.requests[at] = RequestInfo {
                    prompt: *prompt,
                    prefix_hit_blocks: *prefix_hit_blocks,
                    ..RequestInfo::default()
                };
            }
            Event::Allocated {
                block,
                request,
                position,
            } => {
                self.owners.insert(*block, *request);
                if block.engine == Engine::Decode {
                    if let Some(info) = self.requests.get_mut(*request as usize) {
                        match block.kind {
                            BlockKind::Attention => {
                                let at = *position as usize;
                                if info.decode_blocks.len() <= at {
                                    info.decode_blocks.resize(at + 1, *block);
                                }
                                info.decode_blocks[at] = *block;
                            }
                            BlockKind::State => info.decode_state = Some(*block),
                        }
                    }
                }
            }
            Event::Freed { block, .. } => {
                self.owners.remove(block);
            }
            Event::Posted { pairs, .. } => self.in_flight.extend(pairs.iter().copied()),
            Event::Landed { pair } => {
                if let Some(at) = self.in_flight.iter().position(|p| p == pair) {
                    self.in_flight.remove(at);
                }
            }
            _ => {}
        }
    }
}

/// The blocks `span` touches.
pub fn blocks_of(pools: &Pools, span: &Span) -> Vec<BlockRef> {
    let mut out = Vec::new();
    let mut at = span.offset;
    let end = span.offset + span.len;
    while at < end {
        let Some(b) = pools.block_at(span.engine, at) else {
            break;
        };
        out.push(b);
        let (o, l) = pools.span(b);
        at = o + l;
    }
    out
}

/// Whether two spans of one engine overlap.
pub fn overlaps(a: &Span, b_engine: Engine, b_offset: u64, b_len: u64) -> bool {
    a.engine == b_engine && a.offset < b_offset + b_len && b_offset < a.offset + a.len
}
