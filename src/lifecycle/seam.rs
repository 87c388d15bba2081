//! The seam where a connector plugs into a lifecycle scenario. The runner
//! owns both engines' pools and memory, the transport (the embedded
//! loopback with deferred completion), the clock and the record; a
//! connector under test gets them through [`Io`] and applies each
//! operation to both of its engines through [`LifecycleConnector`]. Every
//! allocation, free and local write goes through [`Io`], which records it;
//! the transport's pairs are recorded by the runner when they land.

use crate::nixl::{Loopback, Nixl};

use super::operation::{Engine, Operation, RequestId};
use super::pools::{BlockKind, BlockRef, Pools};
use super::record::{Event, PairSpan, Recorder, Span, WriteCause};
use super::shape::LifecycleShape;

/// A message from prefill to decode outside NIXL (vLLM's proxy hands
/// decode the `kv_transfer_params` of a request prefill finished, or its
/// error).
#[derive(Clone, Debug, PartialEq, Eq)]
// Each variant is documented; its fields are named for what they hold.
#[allow(missing_docs)]
pub enum ProxyMessage {
    /// Prefill computed the request: its blocks and state slot.
    Ready {
        request: RequestId,
        blocks: Vec<BlockRef>,
        state: Option<BlockRef>,
    },
    /// Prefill failed the request.
    Failed { request: RequestId },
    /// The request was aborted on prefill before it was computed.
    Aborted { request: RequestId },
}

/// What a connector acts on during one step.
pub struct Io<'a> {
    /// The geometry as the lifecycle runs it.
    pub shape: &'a LifecycleShape,
    /// Both engines' pools and memory.
    pub pools: &'a mut Pools,
    /// The transport (loopback, completion deferred).
    pub nixl: &'a mut Loopback,
    /// Messages from prefill to decode, in order.
    pub proxy: &'a mut Vec<ProxyMessage>,
    /// The record.
    pub record: &'a mut Recorder,
    /// The clock, in heartbeat intervals.
    pub now: u64,
}

impl Io<'_> {
    /// Record an event.
    pub fn emit(&mut self, event: Event) {
        self.record.push(event);
    }

    /// `request`'s blocks on `engine`, all or none: `n` attention blocks
    /// and, when the geometry has state, one state block, each filled with
    /// the request's sentinel. `Err` is the kind of the pool that has too
    /// few free (attention blocks already taken are freed again).
    pub fn allocate_request(
        &mut self,
        engine: Engine,
        n: u32,
        request: RequestId,
    ) -> Result<(Vec<BlockRef>, Option<BlockRef>), BlockKind> {
        let blocks = self
            .pools
            .allocate(engine, BlockKind::Attention, n, request)
            .ok_or(BlockKind::Attention)?;
        self.fill_allocated(&blocks, request);
        if !self.shape.has_state {
            return Ok((blocks, None));
        }
        let Some(state) = self.pools.allocate(engine, BlockKind::State, 1, request) else {
            for b in blocks {
                self.free(b, request);
            }
            return Err(BlockKind::State);
        };
        self.fill_allocated(&state, request);
        Ok((blocks, Some(state[0])))
    }

    /// Record the allocation of `blocks` to `request` and fill each with
    /// its sentinel.
    fn fill_allocated(&mut self, blocks: &[BlockRef], request: RequestId) {
        for (position, &block) in blocks.iter().enumerate() {
            self.emit(Event::Allocated {
                block,
                request,
                position: position as u32,
            });
            let (offset, len) = self.pools.span(block);
            self.write_fill(
                Span {
                    engine: block.engine,
                    offset,
                    len,
                },
                super::content::sentinel_byte(request),
                request,
                WriteCause::Allocation,
            );
        }
    }

    /// Give `block` back on behalf of `request`.
    pub fn free(&mut self, block: BlockRef, request: RequestId) {
        self.emit(Event::Freed { block, request });
        self.pools.free(block);
    }

    /// Write `bytes` at `span` for `request`.
    pub fn write(&mut self, span: Span, bytes: &[u8], request: RequestId, cause: WriteCause) {
        self.emit(Event::Wrote {
            span,
            request,
            cause,
        });
        self.pools.write(span.engine, span.offset, bytes);
    }

    /// Fill `span` with `byte` for `request`.
    pub fn write_fill(&mut self, span: Span, byte: u8, request: RequestId, cause: WriteCause) {
        self.emit(Event::Wrote {
            span,
            request,
            cause,
        });
        self.pools.fill(span.engine, span.offset, span.len, byte);
    }

    /// The transport, as the connector talks to it.
    pub fn transport(&mut self) -> &mut dyn Nixl {
        self.nixl
    }
}

/// A connector under a lifecycle scenario: both engines' halves of one
/// P/D pair. `apply` handles one operation; `progress` is the engines'
/// step loop, run after every operation (poll transfers, read
/// notifications and proxy messages, free what may be freed).
pub trait LifecycleConnector {
    /// Register both engines' memory with the transport (before any operation).
    fn start(&mut self, io: &mut Io<'_>) -> Result<(), super::error::LifecycleError>;
    /// Apply one operation.
    fn apply(
        &mut self,
        op: &Operation,
        io: &mut Io<'_>,
    ) -> Result<(), super::error::LifecycleError>;
    /// One pass of both engines' step loops.
    fn progress(&mut self, io: &mut Io<'_>) -> Result<(), super::error::LifecycleError>;
    /// The operation that moves `request` on from where it is, if any (the
    /// drain at the end of a scenario runs them).
    fn next_operation(&self, request: RequestId) -> Option<Operation>;
}

/// Spans of a pair, for the record.
pub fn pair_span(request: RequestId, src: Span, dst: Span) -> PairSpan {
    PairSpan { request, src, dst }
}
