//! The recording wrapper: forwards every call to an inner [`Nixl`] and keeps
//! an ordered log of memory registrations, prepared descriptor lists and
//! transfers, so every desc id can be resolved back to byte ranges.

use serde::Serialize;

use super::{
    forward_nixl, AgentId, DescList, DescRow, DlistHandle, DlistTarget, MemKind, MemRegion, Nixl,
    NixlResult, XferHandle, XferOp, XferSpec, XferState,
};

/// One recorded call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum Event {
    /// [`Nixl::register_memory`].
    RegisterMemory {
        /// The agent registering.
        agent: AgentId,
        /// The regions registered.
        regions: Vec<MemRegion>,
    },
    /// [`Nixl::add_remote_agent`].
    AddRemoteAgent {
        /// The agent loading the peer.
        agent: AgentId,
        /// The peer's agent name.
        remote: String,
    },
    /// [`Nixl::prepare_dlist`].
    Dlist {
        /// The agent preparing the list.
        agent: AgentId,
        /// The handle it got.
        handle: DlistHandle,
        /// Whose memory the rows address.
        target: DlistTarget,
        /// The memory type the list was prepared with.
        mem: MemKind,
        /// The rows.
        list: DescList,
    },
    /// [`Nixl::make_xfer`].
    Xfer {
        /// The initiating agent.
        agent: AgentId,
        /// The handle it got.
        handle: XferHandle,
        /// READ or WRITE.
        op: XferOp,
        /// The local prepared list.
        local: DlistHandle,
        /// Rows of the local list, one per pair.
        local_ids: Vec<u32>,
        /// The remote prepared list.
        remote: DlistHandle,
        /// Rows of the remote list, paired index by index with `local_ids`.
        remote_ids: Vec<u32>,
        /// The notification delivered on completion, if any.
        notification: Option<Vec<u8>>,
    },
    /// [`Nixl::post_xfer`].
    Post {
        /// The initiating agent.
        agent: AgentId,
        /// The transfer posted.
        handle: XferHandle,
    },
    /// [`Nixl::send_notification`].
    Notification {
        /// The sending agent.
        agent: AgentId,
        /// The receiving agent's name.
        remote: String,
        /// The message bytes.
        message: Vec<u8>,
    },
}

impl Event {
    /// The list an [`Event::Dlist`] prepared, borrowed from it.
    pub fn dlist(&self) -> Option<RecordedDlist<'_>> {
        match self {
            Event::Dlist {
                agent,
                handle,
                target,
                mem,
                list,
            } => Some(RecordedDlist {
                agent: *agent,
                handle: *handle,
                target,
                mem: *mem,
                list,
            }),
            _ => None,
        }
    }

    /// The transfer an [`Event::Xfer`] prepared: its agent, its handle and
    /// what was asked for, borrowed from it.
    pub fn xfer(&self) -> Option<(AgentId, XferHandle, XferSpec<'_>)> {
        match self {
            Event::Xfer {
                agent,
                handle,
                op,
                local,
                local_ids,
                remote,
                remote_ids,
                notification,
            } => Some((
                *agent,
                *handle,
                XferSpec {
                    op: *op,
                    local: *local,
                    local_ids,
                    remote: *remote,
                    remote_ids,
                    notification: notification.as_deref(),
                },
            )),
            _ => None,
        }
    }
}

/// A prepared descriptor list as recorded.
#[derive(Clone, Copy, Debug)]
pub struct RecordedDlist<'a> {
    /// The agent that prepared it.
    pub agent: AgentId,
    /// The handle it got.
    pub handle: DlistHandle,
    /// Whose memory the rows address.
    pub target: &'a DlistTarget,
    /// The memory type it was prepared with.
    pub mem: MemKind,
    /// The rows.
    pub list: &'a DescList,
}

/// A prepared transfer as recorded, with both descriptor lists.
#[derive(Clone, Debug)]
pub struct RecordedXfer<'a> {
    pub agent: AgentId,
    pub handle: XferHandle,
    pub op: XferOp,
    pub local_list: &'a DescList,
    pub local_ids: &'a [u32],
    pub remote_list: &'a DescList,
    /// The agent the remote list was prepared against.
    pub remote_agent: &'a str,
    pub remote_ids: &'a [u32],
    pub notification: Option<&'a [u8]>,
    pub posted: bool,
}

/// One descriptor pair of a transfer resolved to byte ranges.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ResolvedPair<L> {
    /// Index of the transfer in recording order.
    pub xfer: usize,
    /// Index of the pair inside its transfer.
    pub pair: usize,
    pub op: XferOp,
    pub initiator: AgentId,
    pub remote_agent: String,
    pub local: DescRow,
    pub remote: DescRow,
    pub local_location: L,
    pub remote_location: L,
    /// Whether the transfer was posted (only posted transfers move bytes).
    pub posted: bool,
}

/// Maps a byte range of a named agent's memory to a location the oracles
/// understand (region, kind, token range...). The scenario supplies it from
/// its own model of the memory layout, independent of the connector.
pub trait Classify {
    /// What a row resolves to.
    type Location;
    /// Where `row`, prepared by `initiator` against the agent named
    /// `agent_name`, lies.
    fn classify(&self, initiator: AgentId, agent_name: &str, row: DescRow) -> Self::Location;
}

/// Records every call made through it and forwards it to `inner`.
#[derive(Debug, Default)]
pub struct Recording<T> {
    inner: T,
    events: Vec<Event>,
    names: Vec<String>,
}

impl<T: Nixl> Recording<T> {
    /// Record every call made through `inner`.
    pub fn new(inner: T) -> Self {
        Self {
            inner,
            events: Vec::new(),
            names: Vec::new(),
        }
    }

    /// The wrapped transport.
    pub fn inner(&self) -> &T {
        &self.inner
    }

    /// The wrapped transport, mutably (calls made on it are not recorded).
    pub fn inner_mut(&mut self) -> &mut T {
        &mut self.inner
    }

    /// Unwrap the transport, dropping the log.
    pub fn into_inner(self) -> T {
        self.inner
    }

    /// Every recorded call, in order.
    pub fn events(&self) -> &[Event] {
        &self.events
    }

    /// Name of an agent created through this wrapper.
    pub fn name_of(&self, agent: AgentId) -> Option<&str> {
        self.names.get(agent.0 as usize).map(String::as_str)
    }

    fn dlist(&self, agent: AgentId, handle: DlistHandle) -> Option<(&DescList, &DlistTarget)> {
        self.events
            .iter()
            .filter_map(Event::dlist)
            .find(|d| d.agent == agent && d.handle == handle)
            .map(|d| (d.list, d.target))
    }

    /// Every recorded transfer with its lists, in recording order.
    pub fn xfers(&self) -> Vec<RecordedXfer<'_>> {
        let mut out = Vec::new();
        for (agent, handle, x) in self.events.iter().filter_map(Event::xfer) {
            let (Some((local_list, _)), Some((remote_list, target))) =
                (self.dlist(agent, x.local), self.dlist(agent, x.remote))
            else {
                continue;
            };
            let remote_agent = match target {
                DlistTarget::Remote(name) => name.as_str(),
                DlistTarget::Local => "",
            };
            let posted = self.events.iter().any(
                |p| matches!(p, Event::Post { agent: a, handle: h } if *a == agent && *h == handle),
            );
            out.push(RecordedXfer {
                agent,
                handle,
                op: x.op,
                local_list,
                local_ids: x.local_ids,
                remote_list,
                remote_agent,
                remote_ids: x.remote_ids,
                notification: x.notification,
                posted,
            });
        }
        out
    }

    /// Every pair of every transfer resolved to byte ranges and classified.
    /// Pairs whose ids are out of range are skipped (NIXL rejects them at make time).
    pub fn resolve<C: Classify>(&self, classifier: &C) -> Vec<ResolvedPair<C::Location>> {
        let xfers = self.xfers();
        let mut out = Vec::with_capacity(xfers.iter().map(|x| x.local_ids.len()).sum());
        for (xi, x) in xfers.into_iter().enumerate() {
            let initiator_name = self.name_of(x.agent).unwrap_or("");
            for (pi, (&l, &r)) in x.local_ids.iter().zip(x.remote_ids).enumerate() {
                let (Some(local), Some(remote)) = (
                    x.local_list.get(u64::from(l)),
                    x.remote_list.get(u64::from(r)),
                ) else {
                    continue;
                };
                out.push(ResolvedPair {
                    xfer: xi,
                    pair: pi,
                    op: x.op,
                    initiator: x.agent,
                    remote_agent: x.remote_agent.to_string(),
                    local,
                    remote,
                    local_location: classifier.classify(x.agent, initiator_name, local),
                    remote_location: classifier.classify(x.agent, x.remote_agent, remote),
                    posted: x.posted,
                });
            }
        }
        out
    }
}

impl<T: Nixl> Nixl for Recording<T> {
    forward_nixl!(self => self.inner;
        agent_name, deregister_memory, local_metadata, remove_remote_agent, xfer_state,
        release_xfer, release_dlist, take_notifications,
    );

    fn create_agent(&mut self, name: &str) -> NixlResult<AgentId> {
        let id = self.inner.create_agent(name)?;
        let idx = id.0 as usize;
        if self.names.len() <= idx {
            self.names.resize(idx + 1, String::new());
        }
        self.names[idx] = name.to_string();
        Ok(id)
    }

    fn register_memory(&mut self, agent: AgentId, regions: &[MemRegion]) -> NixlResult<()> {
        self.inner.register_memory(agent, regions)?;
        self.events.push(Event::RegisterMemory {
            agent,
            regions: regions.to_vec(),
        });
        Ok(())
    }

    fn add_remote_agent(&mut self, agent: AgentId, metadata: &[u8]) -> NixlResult<String> {
        let remote = self.inner.add_remote_agent(agent, metadata)?;
        self.events.push(Event::AddRemoteAgent {
            agent,
            remote: remote.clone(),
        });
        Ok(remote)
    }

    fn prepare_dlist(
        &mut self,
        agent: AgentId,
        target: &DlistTarget,
        mem: MemKind,
        list: &DescList,
    ) -> NixlResult<DlistHandle> {
        let handle = self.inner.prepare_dlist(agent, target, mem, list)?;
        self.events.push(Event::Dlist {
            agent,
            handle,
            target: target.clone(),
            mem,
            list: list.clone(),
        });
        Ok(handle)
    }

    fn make_xfer_spec(&mut self, agent: AgentId, xfer: XferSpec<'_>) -> NixlResult<XferHandle> {
        let handle = self.inner.make_xfer_spec(agent, xfer)?;
        self.events.push(Event::Xfer {
            agent,
            handle,
            op: xfer.op,
            local: xfer.local,
            local_ids: xfer.local_ids.to_vec(),
            remote: xfer.remote,
            remote_ids: xfer.remote_ids.to_vec(),
            notification: xfer.notification.map(<[u8]>::to_vec),
        });
        Ok(handle)
    }

    fn post_xfer(&mut self, agent: AgentId, xfer: XferHandle) -> NixlResult<XferState> {
        let state = self.inner.post_xfer(agent, xfer)?;
        self.events.push(Event::Post {
            agent,
            handle: xfer,
        });
        Ok(state)
    }

    fn send_notification(
        &mut self,
        agent: AgentId,
        remote: &str,
        message: &[u8],
    ) -> NixlResult<()> {
        self.inner.send_notification(agent, remote, message)?;
        self.events.push(Event::Notification {
            agent,
            remote: remote.to_string(),
            message: message.to_vec(),
        });
        Ok(())
    }
}
