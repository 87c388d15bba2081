//! The operations a lifecycle scenario is made of: what the engines, the
//! users and the network do to the requests of one P/D pair, in order.

use std::fmt;

use serde::{Deserialize, Serialize};

/// An engine of the P/D pair.
pub use crate::geometry::Engine;

/// A request, by the order of its `submit` in the scenario (0, 1, ...).
pub type RequestId = u32;

/// One operation of a scenario. An operation a request's state does not
/// allow (an abort of a request that has ended, a post before decode
/// allocated) is ignored by the connector, as an engine ignores it; the
/// timeline marks it so.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
// Each variant is documented; its fields are named for what they hold.
#[allow(missing_docs)]
pub enum Operation {
    /// A new request reaches both engines: its prompt length in tokens and
    /// how many of decode's blocks its prefix cache already holds.
    Submit { prompt: u32, prefix_hit_blocks: u32 },
    /// Prefill schedules the request: allocates its blocks, computes its
    /// KV (and mamba state) and tells decode where they are.
    Compute { request: RequestId },
    /// Decode schedules the request: allocates its blocks (the prefix hit
    /// computed locally).
    Allocate { request: RequestId },
    /// Decode handshakes with prefill if it has not yet and posts the
    /// request's READ.
    Post { request: RequestId },
    /// One pair of the posted transfers lands: the `pick`-th of the pairs
    /// still in flight (modulo their number), so pairs land in any order.
    Deliver { pick: u32 },
    /// Decode's first step on a received request: full blocks enter its
    /// prefix cache, the transferred state is used.
    Step { request: RequestId },
    /// Decode finishes the request and frees its blocks.
    Finish { request: RequestId },
    /// Decode preempts the request and frees its blocks.
    Preempt { request: RequestId },
    /// The request is aborted on one engine.
    Abort { request: RequestId, engine: Engine },
    /// Prefill fails the request (its forward pass raised).
    FailPrefill { request: RequestId },
    /// One heartbeat interval passes: in-flight pairs land first, decode
    /// sends its heartbeats unless `missed`, prefill reaps expired leases.
    Tick { missed: bool },
}

impl Operation {
    /// The request the operation names, if any.
    pub fn request(&self) -> Option<RequestId> {
        // Operations hold only numbers: the copy is as cheap as a match.
        self.clone().request_mut().copied()
    }

    /// The request the operation names, to renumber it.
    pub fn request_mut(&mut self) -> Option<&mut RequestId> {
        match self {
            Operation::Compute { request }
            | Operation::Allocate { request }
            | Operation::Post { request }
            | Operation::Step { request }
            | Operation::Finish { request }
            | Operation::Preempt { request }
            | Operation::Abort { request, .. }
            | Operation::FailPrefill { request } => Some(request),
            Operation::Submit { .. } | Operation::Deliver { .. } | Operation::Tick { .. } => None,
        }
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Operation::Submit {
                prompt,
                prefix_hit_blocks,
            } => write!(f, "submit prompt={prompt} prefix_hit={prefix_hit_blocks}"),
            Operation::Compute { request } => write!(f, "compute r{request}"),
            Operation::Allocate { request } => write!(f, "allocate r{request}"),
            Operation::Post { request } => write!(f, "post r{request}"),
            Operation::Deliver { pick } => write!(f, "deliver pick={pick}"),
            Operation::Step { request } => write!(f, "step r{request}"),
            Operation::Finish { request } => write!(f, "finish r{request}"),
            Operation::Preempt { request } => write!(f, "preempt r{request}"),
            Operation::Abort { request, engine } => {
                write!(f, "abort r{request} on {}", engine.as_str())
            }
            Operation::FailPrefill { request } => write!(f, "fail-prefill r{request}"),
            Operation::Tick { missed } => {
                write!(
                    f,
                    "tick{}",
                    if missed { " (heartbeats missed)" } else { "" }
                )
            }
        }
    }
}
