//! Host tensors under a platform that reports device memory, as the vLLM
//! driver runs vLLM's connector: the connector asks for the platform's type
//! (VRAM) on the lists vLLM's rule gives it, and the transport underneath,
//! whose registered regions are host memory, prepares those lists as DRAM.
//! A [`Recording`](super::Recording) around this transport keeps the types
//! the connector asked for.

use super::{
    forward_nixl, AgentId, DescList, DlistHandle, DlistTarget, MemKind, MemRegion, Nixl,
    NixlResult, XferHandle, XferSpec, XferState,
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
    forward_nixl!(self => self.inner;
        create_agent, agent_name, register_memory, deregister_memory, local_metadata,
        add_remote_agent, remove_remote_agent, make_xfer_spec, post_xfer, xfer_state,
        release_xfer, release_dlist, send_notification, take_notifications,
    );

    fn prepare_dlist(
        &mut self,
        agent: AgentId,
        target: &DlistTarget,
        _mem: MemKind,
        list: &DescList,
    ) -> NixlResult<DlistHandle> {
        self.inner.prepare_dlist(agent, target, MemKind::Dram, list)
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
