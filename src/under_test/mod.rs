//! The connector under test: one interface for every connector kvgeom
//! judges, in two steps by batch. *Place*: for each case, which blocks the
//! request holds on each engine. *Run*: on the memory kvgeom prepares for
//! that placement, one [`RunRecord`] per case (what the connector
//! registered, listed and posted, its receive post-process, how it ended,
//! each rank's final memory). One judge ([`judge()`]) turns a record into the
//! case's verdict. A new connector on kvgeom's block layout is one file
//! here; the trait's placement and record are associated types so that
//! SGLang's connector (`crate::sglang::connector`, ranked above this module)
//! implements it with its own pages and driver results.

mod code;
pub mod connector_log;
pub mod covered_range;
pub mod expectations;
pub mod judge;
pub mod kvgeom;
pub mod plan_differences;
pub(crate) mod post_process_calls;
pub mod record;

pub use code::*;
pub use connector_log::ConnectorLog;
pub use covered_range::CoveredRange;
pub use judge::{judge, judge_sweep, PlanComparison, SweepVerdict};
pub use kvgeom::{run_case, run_case_detailed, KvgeomConnector};
pub use record::{RunLog, RunOutcome, RunRecord};

use crate::scenario::Case;
pub use crate::scenario::Placed;

/// A connector kvgeom runs cases through and judges.
///
/// What a placement and a record are belongs to the connector: those on
/// kvgeom's block layout (kvgeom's own, vLLM's, replayed traces) place with
/// [`Placed`] and record a [`RunRecord`] for [`judge()`]; SGLang's pools are
/// not that layout, so `crate::sglang::connector` places its pages and
/// records the driver's result for its own judge.
pub trait ConnectorUnderTest {
    /// Why a batch cannot run at all (the caller exits 2).
    type Error;
    /// Where one case's request lives on each engine (or why it cannot be
    /// placed).
    type Placement;
    /// What one case's run left for its judge.
    type Record;

    /// For each case, where the request lives on each engine.
    fn place(&self, cases: &[Case]) -> Vec<Self::Placement>;

    /// Run every placed case (a case whose placement failed gets a record
    /// saying so) and hand each record to `judge` as soon as it is complete,
    /// so that a batch never holds more than the records being judged; the
    /// judged cases in the cases' order.
    fn run<T: Send>(
        &self,
        cases: &[Case],
        placed: Vec<Self::Placement>,
        judge: &(dyn Fn(Self::Record) -> T + Sync),
    ) -> Result<Vec<T>, Self::Error>;
}
