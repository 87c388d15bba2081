//! The decisions of a request's life that connectors have gotten wrong,
//! one field each, named for the decision. `LifecyclePolicy::default()` is
//! kvgeom's connector; each lifecycle variant (`variants.rs`) changes one.

use serde::Serialize;

/// What decode does with a request's blocks when it is aborted while its
/// READ is still in flight.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AbortInFlight {
    /// Keep them until every pair has landed, then free them.
    #[default]
    HoldUntilLanded,
    /// Free them at once (a write in flight lands in whoever gets them next).
    FreeAtOnce,
}

/// When decode counts a request's transfer as complete.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CompletionCheck {
    /// When the transport reports the whole transfer done.
    #[default]
    WholeTransfer,
    /// As soon as any pair has landed.
    AnyPair,
}

/// When prefill gives a computed request's blocks back.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PrefillRelease {
    /// After decode's notification that it read them, or when the lease expires.
    #[default]
    AfterReadOrLease,
    /// Right after computing (the blocks are evicted before decode reads them).
    AfterCompute,
}

/// Whether prefill tells decode a request failed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureReport {
    /// It does: decode ends the request as failed.
    #[default]
    ToDecode,
    /// It does not: decode waits for KV that never comes.
    Silent,
}

/// What decode does to a transferred mamba state before the first step.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StateAtFirstStep {
    /// Uses it as received.
    #[default]
    Keep,
    /// Clears it (a state slot marked for clearing on allocation).
    Clear,
}

/// Whether decode reads a request whose lease it could not keep.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ExpiredLease {
    /// It does not: the request fails (prefill may have reaped the blocks).
    #[default]
    Fail,
    /// It reads anyway (whatever now holds the reaped blocks).
    Read,
}

/// Every lifecycle decision of the connector.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LifecyclePolicy {
    /// Decode's blocks when aborted with a READ in flight.
    pub abort_in_flight: AbortInFlight,
    /// When a transfer counts as complete.
    pub completion_check: CompletionCheck,
    /// When prefill frees a computed request's blocks.
    pub prefill_release: PrefillRelease,
    /// Whether a prefill failure reaches decode.
    pub failure_report: FailureReport,
    /// The state before the first step.
    pub state_at_first_step: StateAtFirstStep,
    /// A request whose lease expired.
    pub expired_lease: ExpiredLease,
}
