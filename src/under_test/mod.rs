//! The connector under test: one interface for every connector kvgeom
//! judges, in two steps by batch. *Place*: for each case, which blocks the
//! request holds on each engine. *Run*: on the memory kvgeom prepares for
//! that placement, one [`RunRecord`] per case (what the connector
//! registered, listed and posted, its receive post-process, how it ended,
//! each rank's final memory). One judge ([`judge()`]) turns a record into the
//! case's verdict. A new connector under test is one file here.

mod code;
pub mod connector_log;
pub(crate) mod driver;
pub mod expectations;
pub mod judge;
pub mod kvgeom;
pub mod record;
pub mod replay;
pub mod trace_writer;
pub mod vllm;

pub use code::*;
pub use connector_log::ConnectorLog;
pub use judge::{judge, judge_sweep, PlanComparison, SweepVerdict};
pub use kvgeom::{run_case, run_case_detailed, KvgeomConnector};
pub use record::{RunLog, RunOutcome, RunRecord};
pub use trace_writer::{write_trace, TraceWriteError, TRACE_FORMAT_V3};

use crate::scenario::Case;
pub use crate::scenario::Placed;

/// A connector kvgeom runs cases through and judges.
pub trait ConnectorUnderTest {
    /// Why a batch cannot run at all (the caller exits 2).
    type Error;

    /// For each case, the blocks the request holds on each engine.
    fn place(&self, cases: &[Case]) -> Vec<Placed>;

    /// Run every placed case (a case whose placement failed gets a record
    /// saying so) and hand each record to `judge` as soon as it is complete,
    /// so that a batch never holds more than the records being judged; the
    /// judged cases in the cases' order.
    fn run<T: Send>(
        &self,
        cases: &[Case],
        placed: Vec<Placed>,
        judge: &(dyn Fn(RunRecord) -> T + Sync),
    ) -> Result<Vec<T>, Self::Error>;
}
