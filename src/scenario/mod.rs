//! One case end to end: geometry + prompt length + prefix hit + mode +
//! allocation + seed, run through the connector, the recording transport and
//! the oracles.

pub(crate) mod case;
#[cfg(feature = "cuda")]
pub mod device_tensors;
pub(crate) mod engines;
pub(crate) mod error;
pub(crate) mod handshake_record;
pub(crate) mod memory_estimate;
pub(crate) mod placement;
pub(crate) mod prepare;
pub(crate) mod prompt_list;
#[allow(missing_docs)]
pub(crate) mod run;
pub(crate) mod vram;
pub(crate) mod wait;

pub use case::{shell_word, Case, CaseReport, MemoryKind, Outcome, Stats, TransportKind};
#[cfg(feature = "cuda")]
pub use device_tensors::DeviceTensors;
pub use handshake_record::HandshakeRecord;
pub use memory_estimate::{estimate as estimate_memory, touched_prefill_ranks, MemoryEstimate};
pub use placement::Placement;
pub use prepare::{prepare_memory, prepare_placed_memory, PreparedMemory};
pub use run::{shape_and_place, CaseRun, Placed, RunOptions};
