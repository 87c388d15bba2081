//! A transport that moves no bytes: it checks NIXL's argument rules on
//! transfers but knows no memory. Used to replay vLLM traces (whose remote
//! side has no memory) and to plan without allocating.

use std::collections::HashMap;

use super::{
    AgentId, DescList, DlistHandle, DlistTarget, MemKind, MemRegion, Nixl, NixlError, NixlResult,
    XferHandle, XferOp, XferState,
};

#[derive(Debug, Default)]
struct Agent {
    name: String,
    /// Handles share one counter per agent, starting at 1 (as vLLM's recorder does).
    next_handle: u64,
    dlists: HashMap<u64, (DlistTarget, u64)>,
    xfers: HashMap<u64, bool>,
    inbox: Vec<(String, Vec<u8>)>,
}

impl Agent {
    fn next(&mut self) -> u64 {
        self.next_handle += 1;
        self.next_handle
    }
}

/// Checks arguments, moves nothing.
#[derive(Debug, Default)]
pub struct DryRun {
    agents: Vec<Agent>,
}

impl DryRun {
    pub fn new() -> Self {
        Self::default()
    }

    fn agent(&mut self, agent: AgentId) -> NixlResult<&mut Agent> {
        self.agents
            .get_mut(agent.0 as usize)
            .ok_or_else(|| NixlError::NotFound(format!("agent {}", agent.0)))
    }
}

/// Agent names must be usable as NIXL names and as notification keys.
pub(crate) fn check_agent_name(name: &str) -> NixlResult<()> {
    if name.is_empty() || name.contains('\0') {
        return Err(NixlError::InvalidParam(format!(
            "agent name {name:?} must be non-empty and free of NUL bytes"
        )));
    }
    Ok(())
}

/// NIXL's checks on a prepared transfer, shared by the in-process transports.
pub(crate) fn check_xfer_ids(
    local: (&DlistTarget, u64),
    local_ids: &[u32],
    remote: (&DlistTarget, u64),
    remote_ids: &[u32],
) -> NixlResult<()> {
    check_xfer_sides(local.0, local_ids, remote.0, remote_ids)?;
    check_xfer_ranges(local.1, local_ids, remote.1, remote_ids)
}

/// The checks NIXL makes first: the local handle was prepared locally, the
/// remote one against a remote agent, and the index lists are non-empty and
/// of equal length.
pub(crate) fn check_xfer_sides(
    local: &DlistTarget,
    local_ids: &[u32],
    remote: &DlistTarget,
    remote_ids: &[u32],
) -> NixlResult<()> {
    if *local != DlistTarget::Local || matches!(remote, DlistTarget::Local) {
        return Err(NixlError::InvalidParam(
            "local handle must be prepared locally and remote handle against a remote agent".into(),
        ));
    }
    if local_ids.is_empty() || local_ids.len() != remote_ids.len() {
        return Err(NixlError::InvalidParam(format!(
            "index lists differ in length or are empty: {} local vs {} remote",
            local_ids.len(),
            remote_ids.len()
        )));
    }
    Ok(())
}

/// Every index must address a row of its prepared list (`*_len` rows).
pub(crate) fn check_xfer_ranges(
    local_len: u64,
    local_ids: &[u32],
    remote_len: u64,
    remote_ids: &[u32],
) -> NixlResult<()> {
    if let Some(bad) = local_ids.iter().find(|&&i| u64::from(i) >= local_len) {
        return Err(NixlError::InvalidParam(format!(
            "local index {bad} out of range (list has {local_len} descriptors)"
        )));
    }
    if let Some(bad) = remote_ids.iter().find(|&&i| u64::from(i) >= remote_len) {
        return Err(NixlError::InvalidParam(format!(
            "remote index {bad} out of range (list has {remote_len} descriptors)"
        )));
    }
    Ok(())
}

impl Nixl for DryRun {
    fn create_agent(&mut self, name: &str) -> NixlResult<AgentId> {
        self.agents.push(Agent {
            name: name.to_string(),
            ..Agent::default()
        });
        Ok(AgentId(self.agents.len() as u32 - 1))
    }

    fn agent_name(&self, agent: AgentId) -> NixlResult<String> {
        self.agents
            .get(agent.0 as usize)
            .map(|a| a.name.clone())
            .ok_or_else(|| NixlError::NotFound(format!("agent {}", agent.0)))
    }

    fn register_memory(&mut self, agent: AgentId, _regions: &[MemRegion]) -> NixlResult<()> {
        self.agent(agent).map(|_| ())
    }

    fn deregister_memory(&mut self, agent: AgentId, _regions: &[MemRegion]) -> NixlResult<()> {
        self.agent(agent).map(|_| ())
    }

    fn local_metadata(&mut self, agent: AgentId) -> NixlResult<Vec<u8>> {
        Ok(self.agent(agent)?.name.clone().into_bytes())
    }

    fn add_remote_agent(&mut self, agent: AgentId, metadata: &[u8]) -> NixlResult<String> {
        self.agent(agent)?;
        String::from_utf8(metadata.to_vec())
            .map_err(|_| NixlError::InvalidParam("remote metadata is not an agent name".into()))
    }

    fn remove_remote_agent(&mut self, agent: AgentId, _remote: &str) -> NixlResult<()> {
        self.agent(agent).map(|_| ())
    }

    fn prepare_dlist(
        &mut self,
        agent: AgentId,
        target: &DlistTarget,
        _mem: MemKind,
        list: &DescList,
    ) -> NixlResult<DlistHandle> {
        let a = self.agent(agent)?;
        let h = a.next();
        a.dlists.insert(h, (target.clone(), list.len()));
        Ok(DlistHandle(h))
    }

    fn make_xfer(
        &mut self,
        agent: AgentId,
        _op: XferOp,
        local: DlistHandle,
        local_ids: &[u32],
        remote: DlistHandle,
        remote_ids: &[u32],
        _notification: Option<&[u8]>,
    ) -> NixlResult<XferHandle> {
        let a = self.agent(agent)?;
        let l = a
            .dlists
            .get(&local.0)
            .ok_or_else(|| NixlError::InvalidParam(format!("unknown local handle {}", local.0)))?;
        let r = a.dlists.get(&remote.0).ok_or_else(|| {
            NixlError::InvalidParam(format!("unknown remote handle {}", remote.0))
        })?;
        check_xfer_ids((&l.0, l.1), local_ids, (&r.0, r.1), remote_ids)?;
        let h = a.next();
        a.xfers.insert(h, false);
        Ok(XferHandle(h))
    }

    fn post_xfer(&mut self, agent: AgentId, xfer: XferHandle) -> NixlResult<XferState> {
        let a = self.agent(agent)?;
        let posted = a
            .xfers
            .get_mut(&xfer.0)
            .ok_or_else(|| NixlError::NotFound(format!("transfer {}", xfer.0)))?;
        *posted = true;
        Ok(XferState::Done)
    }

    fn xfer_state(&mut self, agent: AgentId, xfer: XferHandle) -> NixlResult<XferState> {
        let a = self.agent(agent)?;
        match a.xfers.get(&xfer.0) {
            Some(true) => Ok(XferState::Done),
            Some(false) => Ok(XferState::InProgress),
            None => Err(NixlError::NotFound(format!("transfer {}", xfer.0))),
        }
    }

    fn release_xfer(&mut self, agent: AgentId, xfer: XferHandle) -> NixlResult<()> {
        self.agent(agent)?.xfers.remove(&xfer.0);
        Ok(())
    }

    fn release_dlist(&mut self, agent: AgentId, dlist: DlistHandle) -> NixlResult<()> {
        self.agent(agent)?.dlists.remove(&dlist.0);
        Ok(())
    }

    fn send_notification(
        &mut self,
        agent: AgentId,
        remote: &str,
        message: &[u8],
    ) -> NixlResult<()> {
        let from = self.agent(agent)?.name.clone();
        if let Some(target) = self.agents.iter_mut().find(|a| a.name == remote) {
            target.inbox.push((from, message.to_vec()));
        }
        Ok(())
    }

    fn take_notifications(&mut self, agent: AgentId) -> NixlResult<Vec<(String, Vec<u8>)>> {
        Ok(std::mem::take(&mut self.agent(agent)?.inbox))
    }
}
