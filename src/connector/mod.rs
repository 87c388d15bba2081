//! The system under test: a NIXL KV connector worker behaving like vLLM
//! 0.33.0's, for hybrid (attention + mamba) models with heterogeneous P/D
//! block geometry.
//!
//! Where to look: registration in `registration.rs`, the attention and mamba
//! local lists in `local_lists.rs`, remote lists in `remote_lists.rs`,
//! multi-read split lists in `split_lists.rs`, handshake checks in
//! `handshake.rs`, desc ids in `desc_ids.rs`, block-id mapping and prefix
//! alignment in `block_mapping.rs`, pull READ planning in `pull.rs`, push
//! WRITE planning in `push.rs`, the receive post-process in `post_process.rs`
//! (with the byte access it needs, `KvMemory`; lowered to device memsets and
//! copies in `post_process_lowering.rs`).
//!
//! Layering: the connector imports only `geometry`, `memory` and `nixl`,
//! never the harness (see docs/architecture.md).

pub(crate) mod block_mapping;
pub(crate) mod conv_split;
pub(crate) mod desc_ids;
pub(crate) mod handshake;
pub(crate) mod local_lists;
pub(crate) mod metadata;
pub(crate) mod planner;
pub(crate) mod policy;
pub mod post_process;
pub(crate) mod post_process_lowering;
pub(crate) mod pull;
pub(crate) mod push;
pub(crate) mod registration;
pub(crate) mod remote_lists;
pub(crate) mod role;
pub(crate) mod split_lists;
pub(crate) mod tp_mapping;
pub(crate) mod worker;

pub use block_mapping::BlockIds;
pub use handshake::HandshakeError;
pub use metadata::HandshakeMetadata;
pub use policy::{NamedPolicy, Policy};
pub use post_process::KvMemory;
pub use post_process_lowering::{lower, run_on_memory, DeviceOp, DeviceProgram};
pub use pull::{PlannedRead, ReadRequest, Received, Receiving};
pub use push::{Sending, WriteRequest};
pub use registration::{KvTensor, Registration};
pub use role::Role;
pub use tp_mapping::pull_source_ranks;
pub use worker::{ConnectorError, Worker, WorkerConfig};
