//! A transport that moves no bytes: it checks NIXL's argument rules on
//! transfers but knows no memory. Used to replay vLLM traces (whose remote
//! side has no memory) and to plan without allocating.

use super::agent_table::{AgentTable, NamedAgent};
use super::checks::{check_xfer_ranges, check_xfer_sides};
use super::handle_table::HandleTable;
use super::{
    AgentId, DescList, DlistHandle, DlistTarget, MemKind, MemRegion, Nixl, NixlError, NixlResult,
    XferHandle, XferSpec, XferState,
};

#[derive(Debug, Default)]
struct Agent {
    name: String,
    /// Each list's target and row count; whether each transfer was posted.
    handles: HandleTable<Prepared, bool>,
    inbox: Vec<(String, Vec<u8>)>,
}

impl NamedAgent for Agent {
    fn name(&self) -> &str {
        &self.name
    }
}

/// What the argument checks need of a prepared list.
#[derive(Debug)]
struct Prepared {
    target: DlistTarget,
    rows: u64,
}

/// Checks arguments, moves nothing. Agent names need not be unique; a
/// notification goes to the first agent of the name, if any.
#[derive(Debug, Default)]
pub struct DryRun {
    agents: AgentTable<Agent>,
}

impl DryRun {
    /// A transport with no agents yet.
    pub fn new() -> Self {
        Self::default()
    }
}

impl Nixl for DryRun {
    fn create_agent(&mut self, name: &str) -> NixlResult<AgentId> {
        self.agents.add(Agent {
            name: name.to_string(),
            ..Agent::default()
        })
    }

    fn agent_name(&self, agent: AgentId) -> NixlResult<String> {
        Ok(self.agents.get(agent)?.name.clone())
    }

    fn register_memory(&mut self, agent: AgentId, _regions: &[MemRegion]) -> NixlResult<()> {
        self.agents.get(agent).map(|_| ())
    }

    fn deregister_memory(&mut self, agent: AgentId, _regions: &[MemRegion]) -> NixlResult<()> {
        self.agents.get(agent).map(|_| ())
    }

    fn local_metadata(&mut self, agent: AgentId) -> NixlResult<Vec<u8>> {
        Ok(self.agents.get(agent)?.name.clone().into_bytes())
    }

    fn add_remote_agent(&mut self, agent: AgentId, metadata: &[u8]) -> NixlResult<String> {
        self.agents.get(agent)?;
        String::from_utf8(metadata.to_vec())
            .map_err(|_| NixlError::InvalidParam("remote metadata is not an agent name".into()))
    }

    fn remove_remote_agent(&mut self, agent: AgentId, _remote: &str) -> NixlResult<()> {
        self.agents.get(agent).map(|_| ())
    }

    fn prepare_dlist(
        &mut self,
        agent: AgentId,
        target: &DlistTarget,
        _mem: MemKind,
        list: &DescList,
    ) -> NixlResult<DlistHandle> {
        let prepared = Prepared {
            target: target.clone(),
            rows: list.len(),
        };
        Ok(self.agents.get_mut(agent)?.handles.add_dlist(prepared))
    }

    fn make_xfer_spec(&mut self, agent: AgentId, xfer: XferSpec<'_>) -> NixlResult<XferHandle> {
        let handles = &mut self.agents.get_mut(agent)?.handles;
        let (l, r) = handles.dlist_pair(xfer.local, xfer.remote)?;
        check_xfer_sides(&l.target, xfer.local_ids, &r.target, xfer.remote_ids)?;
        check_xfer_ranges(l.rows, xfer.local_ids, r.rows, xfer.remote_ids)?;
        Ok(handles.add_xfer(false))
    }

    fn post_xfer(&mut self, agent: AgentId, xfer: XferHandle) -> NixlResult<XferState> {
        *self.agents.get_mut(agent)?.handles.xfer_mut(xfer)? = true;
        Ok(XferState::Done)
    }

    fn xfer_state(&mut self, agent: AgentId, xfer: XferHandle) -> NixlResult<XferState> {
        let posted = *self.agents.get(agent)?.handles.xfer(xfer)?;
        Ok(if posted {
            XferState::Done
        } else {
            XferState::InProgress
        })
    }

    /// Releasing an unknown transfer is no error here.
    fn release_xfer(&mut self, agent: AgentId, xfer: XferHandle) -> NixlResult<()> {
        let _ = self.agents.get_mut(agent)?.handles.remove_xfer(xfer);
        Ok(())
    }

    /// Releasing an unknown list is no error here.
    fn release_dlist(&mut self, agent: AgentId, dlist: DlistHandle) -> NixlResult<()> {
        let _ = self.agents.get_mut(agent)?.handles.remove_dlist(dlist);
        Ok(())
    }

    fn send_notification(
        &mut self,
        agent: AgentId,
        remote: &str,
        message: &[u8],
    ) -> NixlResult<()> {
        let from = self.agents.get(agent)?.name.clone();
        if let Some(target) = self.agents.id_of(remote) {
            self.agents
                .get_mut(target)?
                .inbox
                .push((from, message.to_vec()));
        }
        Ok(())
    }

    fn take_notifications(&mut self, agent: AgentId) -> NixlResult<Vec<(String, Vec<u8>)>> {
        Ok(std::mem::take(&mut self.agents.get_mut(agent)?.inbox))
    }
}
