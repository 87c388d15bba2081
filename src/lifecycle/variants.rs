//! The lifecycle defect variants: each is one decision of
//! [`LifecyclePolicy`] made the way an upstream report says a connector
//! made it, and cites that report (the reports are listed in
//! docs/lifecycle.md). `kvgeom defects` lists them after the connector's
//! defects; `kvgeom mutants` runs the lifecycle scenarios once per variant.

use super::policy::{
    AbortInFlight, CompletionCheck, ExpiredLease, FailureReport, LifecyclePolicy, PrefillRelease,
    StateAtFirstStep,
};

/// One lifecycle defect variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LifecycleDefect {
    /// Decode frees an aborted request's blocks with its READ in flight.
    AbortReuseInFlight,
    /// A transfer counts as complete before every pair landed.
    SuccessWithoutFullWrite,
    /// Prefill frees a request's blocks before decode read them.
    EvictBeforeSend,
    /// A prefill failure never reaches decode.
    FailureNotPropagated,
    /// Decode clears a transferred mamba state before the first step.
    StateClearedAfterTransfer,
    /// Decode reads after its lease expired and prefill reaped the blocks.
    ReadAfterLeaseReaped,
}

/// A variant's row: its name, the report it models, what goes wrong, the
/// oracle expected to fail.
pub struct VariantRow {
    /// The variant.
    pub defect: LifecycleDefect,
    /// Its `--lifecycle-variant` / `kvgeom defects` name.
    pub name: &'static str,
    /// The upstream report it models.
    pub cites: &'static str,
    /// What goes wrong.
    pub description: &'static str,
}

/// Every lifecycle variant, in order.
pub const LIFECYCLE_VARIANTS: [VariantRow; 6] = [
    VariantRow {
        defect: LifecycleDefect::AbortReuseInFlight,
        name: "lifecycle-abort-reuse-in-flight",
        cites: "SGLang PR #35049, #32564, #24527",
        description: "a request aborted with its READ in flight frees its blocks at once; \
                      the write lands in the next request's pages",
    },
    VariantRow {
        defect: LifecycleDefect::SuccessWithoutFullWrite,
        name: "lifecycle-success-without-full-write",
        cites: "TensorRT-LLM PR #19545",
        description: "a transfer reported complete when its first pair lands; decode admits \
                      unwritten blocks to its prefix cache",
    },
    VariantRow {
        defect: LifecycleDefect::EvictBeforeSend,
        name: "lifecycle-evict-before-send",
        cites: "TensorRT-LLM #12542",
        description: "prefill frees a request's blocks right after computing, before decode \
                      read them; the next request's KV is what decode reads",
    },
    VariantRow {
        defect: LifecycleDefect::FailureNotPropagated,
        name: "lifecycle-failure-not-propagated",
        cites: "SGLang PR #36108",
        description: "a prefill failure never reaches decode, which waits for KV that never \
                      comes and never ends the request",
    },
    VariantRow {
        defect: LifecycleDefect::StateClearedAfterTransfer,
        name: "lifecycle-state-cleared-after-transfer",
        cites: "SGLang PR #32995",
        description: "decode clears a transferred mamba state before the request's first \
                      step (mamba_needs_clear)",
    },
    VariantRow {
        defect: LifecycleDefect::ReadAfterLeaseReaped,
        name: "lifecycle-read-after-lease-reaped",
        cites: "vLLM NIXL kv_lease_duration / _reap_expired_send_leases",
        description: "decode reads a request whose lease expired (missed heartbeats) after \
                      prefill reaped its blocks and gave them to another request",
    },
];

impl LifecycleDefect {
    /// Every variant, in table order.
    pub const ALL: [LifecycleDefect; 6] = [
        LifecycleDefect::AbortReuseInFlight,
        LifecycleDefect::SuccessWithoutFullWrite,
        LifecycleDefect::EvictBeforeSend,
        LifecycleDefect::FailureNotPropagated,
        LifecycleDefect::StateClearedAfterTransfer,
        LifecycleDefect::ReadAfterLeaseReaped,
    ];

    /// The variant's row.
    pub fn row(self) -> &'static VariantRow {
        &LIFECYCLE_VARIANTS[self as usize]
    }

    /// Its name.
    pub fn name(self) -> &'static str {
        self.row().name
    }

    /// The variant named `name`.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|d| d.name() == name)
    }

    /// kvgeom's policy with this one decision changed.
    pub fn policy(self) -> LifecyclePolicy {
        let mut p = LifecyclePolicy::default();
        match self {
            LifecycleDefect::AbortReuseInFlight => p.abort_in_flight = AbortInFlight::FreeAtOnce,
            LifecycleDefect::SuccessWithoutFullWrite => {
                p.completion_check = CompletionCheck::AnyPair;
            }
            LifecycleDefect::EvictBeforeSend => p.prefill_release = PrefillRelease::AfterCompute,
            LifecycleDefect::FailureNotPropagated => p.failure_report = FailureReport::Silent,
            LifecycleDefect::StateClearedAfterTransfer => {
                p.state_at_first_step = StateAtFirstStep::Clear;
            }
            LifecycleDefect::ReadAfterLeaseReaped => p.expired_lease = ExpiredLease::Read,
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_row_per_variant_in_order_and_each_changes_one_decision() {
        let mut seen = Vec::new();
        for (i, d) in LifecycleDefect::ALL.into_iter().enumerate() {
            assert_eq!(LIFECYCLE_VARIANTS[i].defect, d);
            assert_eq!(LifecycleDefect::from_name(d.name()), Some(d));
            let p = d.policy();
            assert_ne!(
                p,
                LifecyclePolicy::default(),
                "{} changes nothing",
                d.name()
            );
            assert!(!seen.contains(&p), "{} repeats another variant", d.name());
            seen.push(p);
        }
    }
}
