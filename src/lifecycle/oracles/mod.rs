//! The oracles over a whole scenario, one file each. Every oracle sees the
//! recorded events one by one, in order, with the [`Ledger`] of who owned
//! what just before the event and both engines' memory at the end of the
//! event's step, and reports a [`Finding`] where its invariant breaks; at
//! the end of the scenario it sees the ledger once more.

pub mod admission;
pub mod completion;
pub mod isolation;
pub mod ledger;
pub mod received_bytes;
pub mod release;
pub mod state;

use serde::Serialize;

pub use ledger::Ledger;

use super::operation::RequestId;
use super::pools::Pools;
use super::record::Event;
use super::shape::LifecycleShape;

/// One broken invariant.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// The oracle.
    pub oracle: &'static str,
    /// The step (index into the run's steps) where it broke.
    pub step: usize,
    /// The request concerned, if one.
    pub request: Option<RequestId>,
    /// What broke.
    pub message: String,
}

/// What an oracle sees besides the event.
pub struct View<'a> {
    /// The geometry as run.
    pub shape: &'a LifecycleShape,
    /// Both engines' pools, for their memory and block spans (ownership
    /// comes from the ledger).
    pub pools: &'a Pools,
    /// The ledger before the event.
    pub ledger: &'a Ledger,
    /// The step.
    pub step: usize,
}

/// An oracle over a whole scenario.
pub trait LifecycleOracle {
    /// Its name.
    fn name(&self) -> &'static str;
    /// One event.
    fn observe(&mut self, event: &Event, view: &View<'_>) -> Vec<Finding>;
    /// The end of the scenario (after the drain).
    fn finish(&mut self, view: &View<'_>) -> Vec<Finding>;
}

/// The oracles' names, in the order they run.
pub const ORACLE_NAMES: [&str; 6] = [
    isolation::NAME,
    completion::NAME,
    release::NAME,
    admission::NAME,
    state::NAME,
    received_bytes::NAME,
];

/// A fresh set of every oracle.
pub fn all() -> Vec<Box<dyn LifecycleOracle>> {
    vec![
        Box::new(isolation::Isolation),
        Box::new(completion::Completion::default()),
        Box::new(release::Release),
        Box::new(admission::Admission::default()),
        Box::new(state::State),
        Box::new(received_bytes::ReceivedBytes),
    ]
}

/// A finding at the view's step.
pub fn finding(
    oracle: &'static str,
    view: &View<'_>,
    request: Option<RequestId>,
    message: String,
) -> Finding {
    Finding {
        oracle,
        step: view.step,
        request,
        message,
    }
}
