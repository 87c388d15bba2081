//! [`RunRecord`]: what one case's run of a connector under test produced,
//! as the judge reads it.

use super::connector_log::ConnectorLog;
use crate::layout::Side;
use crate::oracle::OracleInput;
use crate::scenario::{Case, CaseRun, Outcome};

/// How a run ended, as the connector saw it (before any oracle or
/// expectation judged it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RunOutcome {
    /// The transfers and the receive post-process completed.
    Completed,
    /// An engine refused the pair (a handshake check).
    Refused {
        /// The engine that refused.
        side: Side,
        /// Its reason.
        reason: String,
    },
    /// A step after the handshake failed.
    Crashed {
        /// The engine whose step failed.
        side: Side,
        /// The failure.
        message: String,
    },
    /// The request never completes.
    Hung {
        /// What never happens.
        message: String,
    },
    /// The harness could not run the case (not the connector's verdict).
    NotRun {
        /// Why.
        message: String,
    },
    /// vLLM's scheduler cannot make the case's request: not run, neither
    /// passed nor failed.
    NotReachable {
        /// The place phase's reason.
        reason: String,
    },
}

impl RunOutcome {
    /// A driver's `status` for one case as the connector's ending: `done`,
    /// `rejected`, `crashed` or `hung` by `side`; any other status means the
    /// driver could not run the case, and `unknown` words that harness
    /// error from the status and the message.
    pub fn from_driver_status(
        status: &str,
        side: crate::layout::Side,
        message: String,
        unknown: impl FnOnce(&str, &str) -> String,
    ) -> RunOutcome {
        match status {
            "done" => RunOutcome::Completed,
            "rejected" => RunOutcome::Refused {
                side,
                reason: message,
            },
            "crashed" => RunOutcome::Crashed { side, message },
            "hung" => RunOutcome::Hung { message },
            other => RunOutcome::NotRun {
                message: unknown(other, &message),
            },
        }
    }

    /// The connector's ending as the outcome a case reports before the
    /// judge applies the geometry's expectations.
    pub fn to_outcome(&self) -> Outcome {
        match self.clone() {
            RunOutcome::Completed => Outcome::Passed,
            RunOutcome::Refused { side, reason } => Outcome::UnexpectedRejection {
                side,
                message: reason,
            },
            RunOutcome::Crashed { side, message } => Outcome::Crashed { side, message },
            RunOutcome::Hung { message } => Outcome::Hung { message },
            RunOutcome::NotRun { message } => Outcome::Error { message },
            RunOutcome::NotReachable { reason } => Outcome::NotReachable { reason },
        }
    }

    /// An unjudged outcome (passed: completed) as the connector's ending.
    pub fn from_outcome(outcome: Outcome) -> Self {
        match outcome {
            Outcome::Passed | Outcome::Violations | Outcome::MissingRejection { .. } => {
                RunOutcome::Completed
            }
            Outcome::UnexpectedRejection { side, message }
            | Outcome::ExpectedRejection { side, message } => RunOutcome::Refused {
                side,
                reason: message,
            },
            Outcome::Crashed { side, message } => RunOutcome::Crashed { side, message },
            Outcome::Hung { message } => RunOutcome::Hung { message },
            Outcome::Error { message } => RunOutcome::NotRun { message },
            Outcome::NotReachable { reason } => RunOutcome::NotReachable { reason },
        }
    }
}

/// The connector's own log of the run: where the regions each rank
/// registered, every descriptor list (role, memory type, rows), every posted
/// transfer and the receive post-process calls are read from.
pub enum RunLog {
    /// kvgeom's connector: the recording transport (registrations, lists,
    /// transfers), the planned transfers and the post-process per rank.
    Kvgeom(Box<CaseRun>),
    /// What a driver reported of the connector it ran (vLLM's live driver,
    /// or a recorded trace of it), converted by that connector's module.
    Driver(Box<ConnectorLog>),
    /// The connector never ran the case.
    Nothing,
}

/// What one case's run of a connector under test produced.
pub struct RunRecord {
    /// The case run.
    pub case: Case,
    /// How the run ended, as the connector saw it.
    pub outcome: RunOutcome,
    /// When the run completed: the harness's layout model, every posted
    /// pair resolved to byte ranges, and each rank's memory (the final
    /// images moved out of the arenas or read from the driver's files,
    /// never copied).
    pub observed: Option<OracleInput>,
    /// Whether `observed` holds every rank's memory: the byte-level oracles
    /// run only then (a v2 trace without memory images holds none).
    pub bytes_observed: bool,
    /// Bytes the receive post-process zeroed, as far as the harness measures
    /// them (0 when it does not).
    pub zeroed_bytes: u64,
    /// The memory kvgeom's own run of the case holds at its peak (0 when the
    /// connector owns its tensors).
    pub memory_bytes: u64,
    /// The connector's log.
    pub log: RunLog,
    /// Why this run's plan cannot be compared with another's: the harness
    /// could not use what the connector did (`None`: it can).
    pub uncompared: Option<String>,
}

impl RunRecord {
    /// A case the connector never ran: the harness's `outcome`.
    pub fn not_run(case: &Case, outcome: RunOutcome) -> Self {
        let why = outcome.to_outcome().describe();
        RunRecord {
            case: case.clone(),
            outcome,
            observed: None,
            bytes_observed: false,
            zeroed_bytes: 0,
            memory_bytes: 0,
            log: RunLog::Nothing,
            uncompared: Some(why),
        }
    }

    /// What the connector did, connector-neutral (`None` when it never
    /// ran the case). Built on demand from the connector's log: a sweep
    /// that only judges never expands kvgeom's lists.
    pub fn connector_log(&self) -> Option<ConnectorLog> {
        match &self.log {
            RunLog::Kvgeom(run) => Some(ConnectorLog::of_kvgeom(run)),
            RunLog::Driver(log) => Some((**log).clone()),
            RunLog::Nothing => None,
        }
    }

    /// The driver's log, when a driver ran the case.
    pub fn driver_log(&self) -> Option<&ConnectorLog> {
        match &self.log {
            RunLog::Driver(log) => Some(log),
            _ => None,
        }
    }
}
