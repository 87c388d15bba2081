//! The narrow NIXL surface the connector uses, as a trait, and its
//! implementations: [`Loopback`] (in-process, the default), [`DryRun`]
//! (records only, moves nothing), the real agent over nixl-sys (feature
//! `nixl`) and the [`Recording`] wrapper the oracles read.

pub(crate) mod agent_options;
mod agent_table;
mod checks;
pub(crate) mod desc;
pub(crate) mod device_platform;
pub(crate) mod dry_run;
mod handle_table;
pub(crate) mod loopback;
mod loopback_device;
#[cfg(feature = "nixl")]
pub mod real;
pub(crate) mod recording;
#[cfg_attr(not(feature = "nixl"), allow(dead_code))]
pub(crate) mod ucx_hints;

pub use crate::memory::{MemKind, MemRegion};
pub use agent_options::NixlAgentOptions;
pub use desc::{DescList, DescRow, StridedRun};
pub use device_platform::HostAsDevice;
pub use dry_run::DryRun;
pub use loopback::{Loopback, PendingPair};
#[cfg(feature = "nixl")]
pub use real::RealNixl;
pub use recording::{Classify, Event, RecordedDlist, Recording};

use serde::{Deserialize, Serialize};

/// An agent created through [`Nixl::create_agent`]; one per connector worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct AgentId(pub u32);

/// A prepared descriptor list (unique per agent).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct DlistHandle(pub u64);

/// A prepared transfer (unique per agent).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct XferHandle(pub u64);

/// One transfer to prepare: pair `local_ids[i]` of the prepared list
/// `local` with `remote_ids[i]` of `remote`, moving bytes as `op` says,
/// with an optional notification for the peer on completion.
#[derive(Clone, Copy, Debug)]
pub struct XferSpec<'a> {
    /// READ or WRITE.
    pub op: XferOp,
    /// The initiator's prepared list.
    pub local: DlistHandle,
    /// Rows of `local`, one per pair.
    pub local_ids: &'a [u32],
    /// The prepared list of the other side.
    pub remote: DlistHandle,
    /// Rows of `remote`, one per pair.
    pub remote_ids: &'a [u32],
    /// The message the peer receives when the transfer completes.
    pub notification: Option<&'a [u8]>,
}

impl<'a> XferSpec<'a> {
    /// `op` from the rows `local.1` of the list `local.0` to (or from) the
    /// rows `remote.1` of `remote.0`.
    pub fn new(
        op: XferOp,
        local: (DlistHandle, &'a [u32]),
        remote: (DlistHandle, &'a [u32]),
        notification: Option<&'a [u8]>,
    ) -> Self {
        XferSpec {
            op,
            local: local.0,
            local_ids: local.1,
            remote: remote.0,
            remote_ids: remote.1,
            notification,
        }
    }
}

/// Transfer direction from the initiator's view: READ pulls remote -> local,
/// WRITE pushes local -> remote.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum XferOp {
    /// Pull: remote rows are copied into local rows.
    Read,
    /// Push: local rows are copied into remote rows.
    Write,
}

impl XferOp {
    /// `READ` or `WRITE`, as NIXL and the traces spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            XferOp::Read => "READ",
            XferOp::Write => "WRITE",
        }
    }
}

/// State of a posted transfer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum XferState {
    /// Posted, not yet complete.
    InProgress,
    /// Every pair has been copied.
    Done,
}

/// Which agent a descriptor list is prepared against.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DlistTarget {
    /// The initiator's own memory (vLLM's `NIXL_INIT_AGENT`).
    Local,
    /// A loaded remote agent, by name.
    Remote(String),
}

/// Errors, with the same kinds real NIXL returns.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NixlError {
    /// Rejected arguments: pair length mismatch, index lists of different
    /// lengths, an index out of range, swapped handles.
    #[error("NIXL invalid parameter: {0}")]
    InvalidParam(String),
    /// A descriptor outside every registered region, or an unknown agent or handle.
    #[error("NIXL not found: {0}")]
    NotFound(String),
    /// The backend failed (UCX could not start, a transfer failed).
    #[error("NIXL backend error: {0}")]
    Backend(String),
    /// The NIXL runtime library could not be loaded.
    #[error("NIXL runtime unavailable: {0}")]
    RuntimeUnavailable(String),
    /// Something the chosen implementation does not support (e.g. VRAM on loopback).
    #[error("NIXL operation not supported: {0}")]
    Unsupported(String),
}

/// The result of a [`Nixl`] call.
pub type NixlResult<T> = Result<T, NixlError>;

/// The NIXL operations the connector needs. Every call names the agent it is
/// made on, so one transport value can host all workers of a scenario.
pub trait Nixl {
    /// Create an agent; its name is what remote peers see.
    fn create_agent(&mut self, name: &str) -> NixlResult<AgentId>;
    /// The name `agent` was created with.
    fn agent_name(&self, agent: AgentId) -> NixlResult<String>;
    /// Register memory regions with `agent`; descriptors must lie inside them.
    fn register_memory(&mut self, agent: AgentId, regions: &[MemRegion]) -> NixlResult<()>;
    /// Undo [`Nixl::register_memory`] for the same regions.
    fn deregister_memory(&mut self, agent: AgentId, regions: &[MemRegion]) -> NixlResult<()>;
    /// The metadata blob a peer loads with [`Nixl::add_remote_agent`].
    fn local_metadata(&mut self, agent: AgentId) -> NixlResult<Vec<u8>>;
    /// Load a peer's metadata; returns the peer's agent name.
    fn add_remote_agent(&mut self, agent: AgentId, metadata: &[u8]) -> NixlResult<String>;
    /// Forget a peer loaded with [`Nixl::add_remote_agent`], by its name.
    fn remove_remote_agent(&mut self, agent: AgentId, remote: &str) -> NixlResult<()>;
    /// Prepare a descriptor list once; transfers then address its rows by id.
    fn prepare_dlist(
        &mut self,
        agent: AgentId,
        target: &DlistTarget,
        mem: MemKind,
        list: &DescList,
    ) -> NixlResult<DlistHandle>;
    /// Pair `xfer.local_ids[i]` with `xfer.remote_ids[i]` into one
    /// prepared transfer (what each transport implements).
    fn make_xfer_spec(&mut self, agent: AgentId, xfer: XferSpec<'_>) -> NixlResult<XferHandle>;
    /// [`make_xfer_spec`](Self::make_xfer_spec) argument by argument, in
    /// NIXL's `make_xfer_req` order.
    #[allow(clippy::too_many_arguments)]
    fn make_xfer(
        &mut self,
        agent: AgentId,
        op: XferOp,
        local: DlistHandle,
        local_ids: &[u32],
        remote: DlistHandle,
        remote_ids: &[u32],
        notification: Option<&[u8]>,
    ) -> NixlResult<XferHandle> {
        let spec = XferSpec::new(op, (local, local_ids), (remote, remote_ids), notification);
        self.make_xfer_spec(agent, spec)
    }
    /// Start a prepared transfer; its notification, if any, reaches the
    /// peer when it completes.
    fn post_xfer(&mut self, agent: AgentId, xfer: XferHandle) -> NixlResult<XferState>;
    /// Poll a posted transfer.
    fn xfer_state(&mut self, agent: AgentId, xfer: XferHandle) -> NixlResult<XferState>;
    /// Free a prepared transfer.
    fn release_xfer(&mut self, agent: AgentId, xfer: XferHandle) -> NixlResult<()>;
    /// Free a prepared descriptor list.
    fn release_dlist(&mut self, agent: AgentId, dlist: DlistHandle) -> NixlResult<()>;
    /// Send `message` to the peer named `remote`, outside any transfer.
    fn send_notification(&mut self, agent: AgentId, remote: &str, message: &[u8])
        -> NixlResult<()>;
    /// Notifications received by `agent` since the last call: (sender name, message).
    fn take_notifications(&mut self, agent: AgentId) -> NixlResult<Vec<(String, Vec<u8>)>>;
}

/// Implement the named [`Nixl`] methods by handing each call, unchanged,
/// to `$inner`; `$s` is the `self` of the impl they go into (a wrapper
/// writes only the methods it changes).
macro_rules! forward_nixl {
    ($s:ident => $inner:expr; $($method:ident),+ $(,)?) => {
        $($crate::nixl::forward_nixl!(@one $method, $s, $inner);)+
    };
    (@one create_agent, $s:ident, $inner:expr) => {
        fn create_agent(&mut $s, name: &str) -> NixlResult<AgentId> {
            $inner.create_agent(name)
        }
    };
    (@one agent_name, $s:ident, $inner:expr) => {
        fn agent_name(&$s, agent: AgentId) -> NixlResult<String> {
            $inner.agent_name(agent)
        }
    };
    (@one register_memory, $s:ident, $inner:expr) => {
        fn register_memory(&mut $s, agent: AgentId, regions: &[MemRegion]) -> NixlResult<()> {
            $inner.register_memory(agent, regions)
        }
    };
    (@one deregister_memory, $s:ident, $inner:expr) => {
        fn deregister_memory(&mut $s, agent: AgentId, regions: &[MemRegion]) -> NixlResult<()> {
            $inner.deregister_memory(agent, regions)
        }
    };
    (@one local_metadata, $s:ident, $inner:expr) => {
        fn local_metadata(&mut $s, agent: AgentId) -> NixlResult<Vec<u8>> {
            $inner.local_metadata(agent)
        }
    };
    (@one add_remote_agent, $s:ident, $inner:expr) => {
        fn add_remote_agent(&mut $s, agent: AgentId, metadata: &[u8]) -> NixlResult<String> {
            $inner.add_remote_agent(agent, metadata)
        }
    };
    (@one remove_remote_agent, $s:ident, $inner:expr) => {
        fn remove_remote_agent(&mut $s, agent: AgentId, remote: &str) -> NixlResult<()> {
            $inner.remove_remote_agent(agent, remote)
        }
    };
    (@one prepare_dlist, $s:ident, $inner:expr) => {
        fn prepare_dlist(
            &mut $s,
            agent: AgentId,
            target: &DlistTarget,
            mem: MemKind,
            list: &DescList,
        ) -> NixlResult<DlistHandle> {
            $inner.prepare_dlist(agent, target, mem, list)
        }
    };
    (@one make_xfer_spec, $s:ident, $inner:expr) => {
        fn make_xfer_spec(&mut $s, agent: AgentId, xfer: XferSpec<'_>) -> NixlResult<XferHandle> {
            $inner.make_xfer_spec(agent, xfer)
        }
    };
    (@one post_xfer, $s:ident, $inner:expr) => {
        fn post_xfer(&mut $s, agent: AgentId, xfer: XferHandle) -> NixlResult<XferState> {
            $inner.post_xfer(agent, xfer)
        }
    };
    (@one xfer_state, $s:ident, $inner:expr) => {
        fn xfer_state(&mut $s, agent: AgentId, xfer: XferHandle) -> NixlResult<XferState> {
            $inner.xfer_state(agent, xfer)
        }
    };
    (@one release_xfer, $s:ident, $inner:expr) => {
        fn release_xfer(&mut $s, agent: AgentId, xfer: XferHandle) -> NixlResult<()> {
            $inner.release_xfer(agent, xfer)
        }
    };
    (@one release_dlist, $s:ident, $inner:expr) => {
        fn release_dlist(&mut $s, agent: AgentId, dlist: DlistHandle) -> NixlResult<()> {
            $inner.release_dlist(agent, dlist)
        }
    };
    (@one send_notification, $s:ident, $inner:expr) => {
        fn send_notification(
            &mut $s,
            agent: AgentId,
            remote: &str,
            message: &[u8],
        ) -> NixlResult<()> {
            $inner.send_notification(agent, remote, message)
        }
    };
    (@one take_notifications, $s:ident, $inner:expr) => {
        fn take_notifications(&mut $s, agent: AgentId) -> NixlResult<Vec<(String, Vec<u8>)>> {
            $inner.take_notifications(agent)
        }
    };
}
pub(crate) use forward_nixl;

impl<T: Nixl + ?Sized> Nixl for Box<T> {
    forward_nixl!(self => (**self);
        create_agent, agent_name, register_memory, deregister_memory, local_metadata,
        add_remote_agent, remove_remote_agent, prepare_dlist, make_xfer_spec, post_xfer,
        xfer_state, release_xfer, release_dlist, send_notification, take_notifications,
    );
}
