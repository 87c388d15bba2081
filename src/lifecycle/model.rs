//! The reference model beside the connector: each request's phase as the
//! operations move it under a correct connector, in the manner of
//! proptest-state-machine's reference state. The generator draws from the
//! operations the model enables (most of them move a request on, some are
//! aborts and failures at any point), so that scenarios reach every phase
//! with several requests in flight.

use super::operation::{Engine, Operation, RequestId};

/// A request's phase in the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Submitted; neither engine has blocks yet.
    Submitted,
    /// Prefill computed it; decode has no blocks yet.
    Computed,
    /// Decode allocated; prefill has not computed it yet.
    Allocated,
    /// Both engines hold its blocks; decode has not posted.
    Both,
    /// Decode posted its READ.
    Posted,
    /// Decode decodes it (first step taken).
    Decoding,
    /// It ended.
    Ended,
}

/// The reference model.
#[derive(Clone, Debug, Default)]
pub struct ReferenceModel {
    /// Each request's phase, by id.
    pub phases: Vec<Phase>,
}

impl ReferenceModel {
    /// Requests not ended.
    pub fn live(&self) -> Vec<RequestId> {
        (0..self.phases.len() as u32)
            .filter(|&r| self.phases[r as usize] != Phase::Ended)
            .collect()
    }

    /// The operation that moves `r` on.
    pub fn next(&self, r: RequestId, prefill_first: bool) -> Option<Operation> {
        let request = r;
        Some(match self.phases.get(r as usize)? {
            Phase::Submitted if prefill_first => Operation::Compute { request },
            Phase::Submitted => Operation::Allocate { request },
            Phase::Computed => Operation::Allocate { request },
            Phase::Allocated => Operation::Compute { request },
            Phase::Both => Operation::Post { request },
            Phase::Posted => Operation::Step { request },
            Phase::Decoding => Operation::Finish { request },
            Phase::Ended => return None,
        })
    }

    /// Take `op` into account.
    pub fn apply(&mut self, op: &Operation) {
        if let Operation::Submit { .. } = op {
            self.phases.push(Phase::Submitted);
            return;
        }
        let Some(r) = op.request() else { return };
        let Some(phase) = self.phases.get_mut(r as usize) else {
            return;
        };
        *phase = match (*phase, op) {
            (Phase::Ended, _) => Phase::Ended,
            (_, Operation::Finish { .. } | Operation::Preempt { .. })
                if *phase == Phase::Decoding =>
            {
                Phase::Ended
            }
            (
                _,
                Operation::Abort {
                    engine: Engine::Decode,
                    ..
                },
            ) => Phase::Ended,
            (
                Phase::Submitted | Phase::Allocated,
                Operation::Abort { .. } | Operation::FailPrefill { .. },
            ) => Phase::Ended,
            (Phase::Submitted, Operation::Compute { .. }) => Phase::Computed,
            (Phase::Submitted, Operation::Allocate { .. }) => Phase::Allocated,
            (Phase::Computed, Operation::Allocate { .. }) => Phase::Both,
            (Phase::Allocated, Operation::Compute { .. }) => Phase::Both,
            (Phase::Both, Operation::Post { .. }) => Phase::Posted,
            (Phase::Posted, Operation::Step { .. }) => Phase::Decoding,
            (p, _) => p,
        };
    }
}
