//! Host tensors under a platform that reports device memory, as the vLLM
//! driver runs vLLM's connector: the connector asks for the platform's type
//! (VRAM) on the lists vLLM's rule gives it, and the transport underneath,
//! whose registered regions are host memory, prepares those lists as DRAM.
//! A [`Recording`](super::Recording) around this transport keeps the types
//! the connector asked for.

use super::{
    AgentId, DescList, DlistHandle, DlistTarget, MemKind, MemRegion, Nixl, NixlResult, XferHandle,
    XferSpec, XferState,
};

/// A transport whose VRAM lists are host memory.
pub struct HostAsDevice<T> {
    inner: T,
}

impl<T> HostAsDevice<T> {
    /// Wrap `inner`, whose memory is host memory.
    pub fn new(inner: T) -> Self {
        HostAsDevice { inner }
    }
}

impl<T: Nixl> Nixl for HostAsDevice<T> {
    fn create_agent(&mut self, name: &str) -> NixlResult<AgentId> {
        self.inner.create_agent(name)
    }
    fn agent_name(&self, agent: AgentId) -> NixlResult<String> {
        self.inner.agent_name(agent)
    }
    fn register_memory(&mut self, agent: AgentId, regions: &[MemRegion]) -> NixlResult<()> {
        self.inner.register_memory(agent, regions)
    }
    fn deregister_memory(&mut self, agent: AgentId, regions: &[MemRegion]) -> NixlResult<()> {
        self.inner.deregister_memory(agent, regions)
    }
    fn local_metadata(&mut self, agent: AgentId) -> NixlResult<Vec<u8>> {
        self.inner.local_metadata(agent)
    }
    fn add_remote_agent(&mut self, agent: AgentId, metadata: &[u8]) -> NixlResult<String> {
        self.inner.add_remote_agent(agent, metadata)
    }
    fn remove_remote_agent(&mut self, agent: AgentId, remote: &str) -> NixlResult<()> {
        self.inner.remove_remote_agent(agent, remote)
    }
    fn prepare_dlist(
        &mut self,
        agent: AgentId,
        target: &DlistTarget,
        _mem: MemKind,
        list: &DescList,
    ) -> NixlResult<DlistHandle> {
        self.inner.prepare_dlist(agent, target, MemKind::Dram, list)
    }
    fn make_xfer_spec(&mut self, agent: AgentId, xfer: XferSpec<'_>) -> NixlResult<XferHandle> {
        self.inner.make_xfer_spec(agent, xfer)
    }
    fn post_xfer(&mut self, agent: AgentId, xfer: XferHandle) -> NixlResult<XferState> {
        self.inner.post_xfer(agent, xfer)
    }
    fn xfer_state(&mut self, agent: AgentId, xfer: XferHandle) -> NixlResult<XferState> {
        self.inner.xfer_state(agent, xfer)
    }
    fn release_xfer(&mut self, agent: AgentId, xfer: XferHandle) -> NixlResult<()> {
        self.inner.release_xfer(agent, xfer)
    }
    fn release_dlist(&mut self, agent: AgentId, dlist: DlistHandle) -> NixlResult<()> {
        self.inner.release_dlist(agent, dlist)
    }
    fn send_notification(
        &mut self,
        agent: AgentId,
        remote: &str,
        message: &[u8],
    ) -> NixlResult<()> {
        self.inner.send_notification(agent, remote, message)
    }
    fn take_notifications(&mut self, agent: AgentId) -> NixlResult<Vec<(String, Vec<u8>)>> {
        self.inner.take_notifications(agent)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::HostArena;
    use crate::nixl::{DescRow, Loopback, Recording};

    /// A VRAM list over host memory: refused by the loopback alone,
    /// prepared through [`HostAsDevice`], and recorded as VRAM.
    #[test]
    fn vram_lists_land_on_host_memory_and_are_recorded_as_asked() {
        let arena = HostArena::new(64);
        let region = MemRegion {
            addr: arena.base(),
            len: 64,
            mem: MemKind::Dram,
            dev: 0,
        };
        let list = DescList::from_rows([DescRow {
            addr: arena.base(),
            len: 16,
            dev: 0,
        }]);
        let mut plain = Loopback::new();
        plain.attach(arena.clone());
        let a = plain.create_agent("a").unwrap();
        plain.register_memory(a, &[region]).unwrap();
        assert!(plain
            .prepare_dlist(a, &DlistTarget::Local, MemKind::Vram, &list)
            .is_err());

        let mut inner = Loopback::new();
        inner.attach(arena);
        let mut nixl = Recording::new(HostAsDevice::new(inner));
        let a = nixl.create_agent("a").unwrap();
        nixl.register_memory(a, &[region]).unwrap();
        nixl.prepare_dlist(a, &DlistTarget::Local, MemKind::Vram, &list)
            .unwrap();
        let recorded: Vec<MemKind> = nixl
            .events()
            .iter()
            .filter_map(|e| match e {
                crate::nixl::Event::Dlist { mem, .. } => Some(*mem),
                _ => None,
            })
            .collect();
        assert_eq!(recorded, [MemKind::Vram]);
    }
}
