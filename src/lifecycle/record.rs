//! What a scenario's run records, step by step: every allocation and free
//! (the ownership of each block over time), every byte range written and
//! by whom, every pair posted and landed, and what the connector reported
//! (a transfer received, a block admitted to the prefix cache, a request's
//! first step and its end). The oracles read only this record and the
//! engines' memory.

use serde::Serialize;

use super::operation::{Engine, RequestId};
use super::pools::BlockRef;

/// A byte range of one engine's arena.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Span {
    /// The engine.
    pub engine: Engine,
    /// First byte.
    pub offset: u64,
    /// Bytes.
    pub len: u64,
}

/// One descriptor pair of a posted READ: `len` bytes from prefill to decode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct PairSpan {
    /// The request whose transfer it is.
    pub request: RequestId,
    /// Prefill's bytes.
    pub src: Span,
    /// Decode's bytes.
    pub dst: Span,
}

/// Why the connector wrote bytes of its own memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WriteCause {
    /// The allocation's sentinel (nothing was written yet).
    Allocation,
    /// Prefill's forward pass, or decode's prefix hit computed locally.
    Compute,
    /// The receive post-process zeroing the tail of the last block.
    Zeroing,
    /// The state cleared before the first step.
    StateClear,
}

/// How a request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum End {
    /// Decoded and finished.
    Finished,
    /// Preempted by decode.
    Preempted,
    /// Aborted on either engine.
    Aborted,
    /// Failed (on prefill, or its lease could not be kept).
    Failed,
}

/// One recorded event.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
// Each variant is documented; its fields are named for what they hold.
#[allow(missing_docs)]
pub enum Event {
    /// A request was submitted.
    Submitted {
        request: RequestId,
        prompt: u32,
        prefix_hit_blocks: u32,
    },
    /// `block` now belongs to `request`, as its `position`-th block of its kind.
    Allocated {
        block: BlockRef,
        request: RequestId,
        position: u32,
    },
    /// `block` was given back to its pool by `request`'s handling.
    Freed { block: BlockRef, request: RequestId },
    /// The connector wrote `span` for `request`.
    Wrote {
        span: Span,
        request: RequestId,
        cause: WriteCause,
    },
    /// A READ was posted with these pairs.
    Posted {
        request: RequestId,
        transfer: u64,
        pairs: Vec<PairSpan>,
    },
    /// One pair landed.
    Landed { pair: PairSpan },
    /// Decode received the request's KV (its transfer is complete, by its account).
    Received { request: RequestId },
    /// A decode block entered the prefix cache.
    Admitted { request: RequestId, block: BlockRef },
    /// Decode's first step on the request.
    FirstStep { request: RequestId },
    /// Prefill failed the request.
    PrefillFailed { request: RequestId },
    /// Prefill reaped the request's expired lease.
    LeaseReaped { request: RequestId },
    /// The request ended.
    Ended { request: RequestId, end: End },
    /// The connector ignored an operation the request's state does not allow.
    Ignored { reason: String },
}

/// The events of one step (one operation, or one step of the drain).
#[derive(Clone, Debug, Default, Serialize)]
pub struct StepRecord {
    /// The operation, as the timeline prints it.
    pub operation: String,
    /// Whether this step is part of the drain that ends the scenario.
    pub drain: bool,
    /// The clock (heartbeat intervals) after the step.
    pub now: u64,
    /// The events, in order.
    pub events: Vec<Event>,
}

/// Where the events go: the record of the running step.
#[derive(Debug, Default)]
pub struct Recorder {
    /// Every step so far.
    pub steps: Vec<StepRecord>,
}

impl Recorder {
    /// Start a step.
    pub fn begin(&mut self, operation: String, drain: bool, now: u64) {
        self.steps.push(StepRecord {
            operation,
            drain,
            now,
            events: Vec::new(),
        });
    }

    /// Record an event in the running step.
    pub fn push(&mut self, event: Event) {
        if let Some(step) = self.steps.last_mut() {
            step.events.push(event);
        }
    }

    /// The running step.
    pub fn current(&self) -> Option<&StepRecord> {
        self.steps.last()
    }
}
