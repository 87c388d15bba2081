//! Judging SGLang's own P/D KV transfer (`kvgeom sweep --connector
//! sglang`): kvgeom's model of SGLang's pools ([`layout`]), the memory it
//! prepares and expects ([`images`]), the driver's batch and results
//! ([`batch`], [`result`]), what a case takes of the memory budget
//! ([`memory`]), the oracles over a run ([`oracles`]; written
//! here because kvgeom's vLLM layout model does not describe SGLang's
//! pools), SGLang as a connector under test ([`connector`]: place, run the
//! driver's batch, hand each record to the judge), the judging of a run
//! ([`run`]) and its cases recorded as traces ([`trace_file`]).
//! docs/sglang.md describes it for users.

pub mod batch;
pub mod connector;
pub mod error;
pub mod final_memory;
pub mod images;
pub mod layout;
pub mod memory;
pub mod oracles;
pub mod python;
pub mod result;
pub mod run;
pub mod state;
pub mod trace_file;
