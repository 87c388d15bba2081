//! Request lifecycles on one P/D pair: several requests in flight on
//! shared block pools, their operations interleaved (submit, compute,
//! allocate, post, completions landing late and out of order, aborts on
//! either engine at any point, finish, preempt, prefill failures,
//! heartbeats and lease expiry), each block owned by one request or free
//! at every step, judged by oracles over the whole scenario.
//!
//! - `operation.rs`: the operations; `shape.rs`: what a geometry gives a
//!   lifecycle; `pools.rs`: the shared pools and their ownership;
//!   `content.rs`: the bytes blocks must hold.
//! - `scenario_connector.rs`: a connector as the sweep sees it
//!   ([`ScenarioConnector`]: a scenario in, its judged record out; what
//!   the one pipeline's connectors hand out); `seam.rs`: where a connector
//!   run in process plugs in ([`LifecycleConnector`] over [`Io`]);
//!   `kvgeom_connector.rs`: kvgeom's connector; `policy.rs`: its
//!   lifecycle decisions; `variants.rs`: the lifecycle defect variants.
//! - `record.rs`: what a run records; `runner.rs`: one scenario run with
//!   its drain; `oracles/`: one file per oracle; `model.rs`: the reference
//!   model; `generator.rs` and `shrink.rs`: drawing and shrinking
//!   scenarios; `fuzz_input.rs`: one from raw bytes; `timeline.rs`: a run
//!   printed step by step; `sweep.rs`:
//!   many scenarios on many geometries, and the variants' runs.

pub mod content;
pub mod error;
pub mod fuzz_input;
pub mod generator;
pub mod kvgeom_connector;
pub mod model;
pub mod operation;
pub mod oracles;
pub mod policy;
pub mod pools;
pub mod record;
pub mod runner;
pub mod scenario_connector;
pub mod seam;
pub mod shape;
pub mod shrink;
pub mod sweep;
pub mod timeline;
pub mod variants;

pub use error::LifecycleError;
pub use kvgeom_connector::KvgeomLifecycle;
pub use operation::{Engine, Operation, RequestId};
pub use policy::LifecyclePolicy;
pub use runner::{run_scenario, Scenario, ScenarioRun};
pub use scenario_connector::{KvgeomScenarios, ScenarioConnector};
pub use seam::{Io, LifecycleConnector};
pub use shape::LifecycleShape;
pub use variants::{LifecycleDefect, LIFECYCLE_VARIANTS};

#[cfg(test)]
mod tests;
