//! One case end to end: geometry + prompt length + prefix hit + mode +
//! allocation + seed, run through the connector, the recording transport and
//! the oracles.

pub mod case;
pub mod engines;
pub mod placement;
pub mod run;
pub mod vram;
pub mod wait;

pub use case::{Case, CaseReport, MemoryKind, Outcome, Stats, TransportKind};
pub use run::{run_case, run_case_detailed, CaseRun, RunOptions};
