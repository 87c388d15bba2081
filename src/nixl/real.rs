//! Real NIXL agents through nixl-sys (cargo feature `nixl`), one nixl-sys
//! agent with a UCX backend per [`AgentId`].
//!
//! nixl-sys is built in stub mode: it loads `libnixl_capi.so` at run time and
//! aborts the process on any call when the library is missing, except
//! `nixl_sys::is_stub()`. [`RealNixl::new`] checks that first and returns
//! [`NixlError::RuntimeUnavailable`], so nothing else here runs without the
//! library.
//!
//! Descriptor lists stay in this crate's strided form until they reach NIXL,
//! where they are expanded to plain rows (nixl-sys 1.5.2 has no strided API).
//! Argument checks are left to NIXL itself, so its verdicts can be compared
//! with [`super::Loopback`]'s; only what NIXL cannot see is checked here
//! (unknown handles, ids beyond `i32`, memory the transport does not own).
//!
//! Memory safety: NIXL writes wherever a registration points. Host memory can
//! only be registered inside a [`HostArena`] given to [`RealNixl::attach`]
//! (kept alive by the transport), and device memory inside a range given to
//! the `unsafe` [`RealNixl::attach_device_memory`] or inside a CUDA buffer
//! given to `RealNixl::attach_device` (cargo feature `cuda`; kept alive by
//! the transport too).
//!
//! Threads: nixl-sys descriptor lists, prepared handles and notification maps
//! are not `Send`, so neither is `RealNixl`: it stays on the thread that
//! created it. A parallel sweep creates one per worker thread.

use nixl_sys as sys;

use super::agent_table::{AgentTable, NamedAgent};
use super::handle_table::HandleTable;
use super::ucx_hints;
use super::{
    AgentId, DescList, DlistHandle, DlistTarget, MemKind, MemRegion, Nixl, NixlAgentOptions,
    NixlError, NixlResult, XferHandle, XferOp, XferSpec, XferState,
};
use crate::memory::HostArena;

/// The NIXL backend every agent uses.
const BACKEND: &str = "UCX";

/// How to get the runtime, for error messages.
const INSTALL_HINT: &str = "install it with `scripts/install-nixl-runtime.sh`, then \
                            `source .nixl-runtime/env.sh` (sets LD_LIBRARY_PATH, NIXL_PLUGIN_DIR \
                            and the UCX loopback settings for host memory; \
                            .nixl-runtime/env-gpu.sh also allows UCX's CUDA transports for \
                            device memory)";

/// Real NIXL agents in this process.
pub struct RealNixl {
    // Fields drop in order: agents (with their requests, handles and
    // registrations) before the memory they point into.
    agents: AgentTable<RealAgent>,
    arenas: Vec<HostArena>,
    #[cfg(feature = "cuda")]
    device_arenas: Vec<crate::memory::DeviceArena>,
    device_memory: Vec<MemRegion>,
    options: NixlAgentOptions,
}

struct RealAgent {
    name: String,
    // Requests, prepared lists and registrations must go before `agent`
    // (fields drop in declaration order; prepared lists hold a raw pointer
    // to the agent). The table drops its requests before its lists.
    handles: HandleTable<sys::XferDlistHandle, sys::XferRequest>,
    registrations: Vec<(MemRegion, sys::RegistrationHandle)>,
    agent: sys::Agent,
}

impl NamedAgent for RealAgent {
    fn name(&self) -> &str {
        &self.name
    }
}

/// A registered range, as nixl-sys wants to see it.
#[derive(Debug)]
struct RawMemory {
    addr: usize,
    len: usize,
    mem: sys::MemType,
    dev: u64,
}

// SAFETY: the pointer is only handed to NIXL, which registers the range with
// UCX. `RealNixl::register_memory` builds a `RawMemory` only for ranges inside
// an attached host arena (kept alive by the transport, so the range stays
// allocated until the registration is dropped with the agent) or inside
// device memory whose lifetime the caller of `attach_device_memory` vouched for.
impl sys::MemoryRegion for RawMemory {
    unsafe fn as_ptr(&self) -> *const u8 {
        std::ptr::with_exposed_provenance(self.addr)
    }

    fn size(&self) -> usize {
        self.len
    }
}

impl sys::NixlDescriptor for RawMemory {
    fn mem_type(&self) -> sys::MemType {
        self.mem
    }

    fn device_id(&self) -> u64 {
        self.dev
    }
}

fn mem_type(mem: MemKind) -> sys::MemType {
    match mem {
        MemKind::Dram => sys::MemType::Dram,
        MemKind::Vram => sys::MemType::Vram,
    }
}

/// A nixl-sys error as this crate's kind, with what was being done.
fn nixl_error(what: String, e: sys::NixlError) -> NixlError {
    let text = format!("{what}: {e} (NIXL logs the reason on stderr)");
    match e {
        sys::NixlError::InvalidParam
        | sys::NixlError::IndexOutOfBounds
        | sys::NixlError::StringConversionError(_) => NixlError::InvalidParam(text),
        sys::NixlError::NotFound => NixlError::NotFound(text),
        _ => NixlError::Backend(text),
    }
}

fn to_usize(v: u64, what: &str) -> NixlResult<usize> {
    usize::try_from(v).map_err(|_| NixlError::InvalidParam(format!("{what} {v} exceeds usize")))
}

fn to_i32_ids(ids: &[u32], side: &str) -> NixlResult<Vec<i32>> {
    ids.iter()
        .map(|&id| {
            i32::try_from(id).map_err(|_| {
                NixlError::InvalidParam(format!("{side} index {id} is beyond NIXL's i32 range"))
            })
        })
        .collect()
}

impl RealNixl {
    /// Check that the NIXL runtime loads and offers the UCX backend; agents
    /// get the [`NixlAgentOptions`] of the environment.
    pub fn new() -> NixlResult<Self> {
        Self::with_options(NixlAgentOptions::from_env()?)
    }

    /// As [`Self::new`], with explicit agent options.
    pub fn with_options(options: NixlAgentOptions) -> NixlResult<Self> {
        if sys::is_stub() {
            return Err(NixlError::RuntimeUnavailable(format!(
                "libnixl_capi.so could not be loaded (it is not on LD_LIBRARY_PATH); {INSTALL_HINT}"
            )));
        }
        let probe = sys::Agent::new("kvgeom-runtime-probe")
            .map_err(|e| nixl_error("creating a probe agent".into(), e))?;
        let plugins = probe
            .get_available_plugins()
            .map_err(|e| nixl_error("listing NIXL plugins".into(), e))?;
        if !plugins.iter().any(|p| p.is_ok_and(|p| p == BACKEND)) {
            return Err(NixlError::RuntimeUnavailable(format!(
                "NIXL loaded but its {BACKEND} plugin was not found (NIXL_PLUGIN_DIR={:?}); \
                 {INSTALL_HINT}",
                std::env::var("NIXL_PLUGIN_DIR").unwrap_or_default()
            )));
        }
        Ok(Self {
            agents: AgentTable::default(),
            arenas: Vec::new(),
            #[cfg(feature = "cuda")]
            device_arenas: Vec::new(),
            device_memory: Vec::new(),
            options,
        })
    }

    /// The settings every agent of this transport is created with.
    pub fn options(&self) -> NixlAgentOptions {
        self.options
    }

    /// Let agents register host memory inside `arena`; the transport keeps
    /// the arena alive. Attaching the same arena twice has no effect.
    pub fn attach(&mut self, arena: HostArena) {
        if !self.arenas.iter().any(|a| a.same_as(&arena)) {
            self.arenas.push(arena);
        }
    }

    /// Let agents register the device memory `region` (`MemKind::Vram`,
    /// `dev` = CUDA device ordinal, `addr` = the device pointer).
    ///
    /// # Safety
    ///
    /// The range must be device memory allocated on `region.dev` that stays
    /// allocated until this `RealNixl` is dropped: NIXL reads and writes it
    /// whenever a transfer says so.
    pub unsafe fn attach_device_memory(&mut self, region: MemRegion) -> NixlResult<()> {
        if region.mem != MemKind::Vram {
            return Err(NixlError::InvalidParam(format!(
                "{region} is host memory: attach its HostArena instead"
            )));
        }
        self.device_memory.push(region);
        Ok(())
    }

    /// Let agents register VRAM inside a CUDA buffer; the transport keeps
    /// the buffer alive. Attaching the same buffer twice has no effect.
    #[cfg(feature = "cuda")]
    pub fn attach_device(&mut self, arena: crate::memory::DeviceArena) {
        if self.device_arenas.iter().any(|a| a.same_as(&arena)) {
            return;
        }
        // The clone kept here holds the buffer allocated until this
        // transport is dropped, after its agents and their registrations
        // (field order): the guarantee `attach_device_memory` asks for.
        self.device_memory.push(arena.region());
        self.device_arenas.push(arena);
    }

    /// Whether the transport owns the memory `region` points at.
    fn owns(&self, region: &MemRegion) -> bool {
        match region.mem {
            MemKind::Dram => self
                .arenas
                .iter()
                .any(|a| a.contains(region.addr, region.len)),
            MemKind::Vram => self.device_memory.iter().any(|d| {
                d.dev == region.dev
                    && d.addr <= region.addr
                    && region.addr.checked_add(region.len).is_some_and(|end| {
                        d.addr.checked_add(d.len).is_some_and(|d_end| end <= d_end)
                    })
            }),
        }
    }
}

impl std::fmt::Debug for RealNixl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RealNixl")
            .field(
                "agents",
                &self.agents.iter().map(|a| &a.name).collect::<Vec<_>>(),
            )
            .field("arenas", &self.arenas.len())
            .field("device_memory", &self.device_memory)
            .finish()
    }
}

impl RealAgent {
    fn err<'a>(&'a self, what: &'a str) -> impl FnOnce(sys::NixlError) -> NixlError + 'a {
        move |e| nixl_error(format!("{what} on agent '{}'", self.name), e)
    }
}

impl Drop for RealNixl {
    fn drop(&mut self) {
        // Disconnect every agent from its peers while all of them still
        // exist, so that no agent reaches for one already destroyed.
        for a in self.agents.iter_mut() {
            a.handles.clear();
        }
        for a in self.agents.iter() {
            // Nothing to report to at this point; a failure only means the
            // peer was already forgotten.
            let _ = a.agent.invalidate_all_remotes();
        }
    }
}

impl Nixl for RealNixl {
    fn create_agent(&mut self, name: &str) -> NixlResult<AgentId> {
        self.agents.check_new_name(name)?;
        let config = sys::AgentConfig {
            enable_prog_thread: true,
            pthr_delay_us: self.options.progress_delay_us,
            thread_sync: sys::ThreadSync::Default,
            ..sys::AgentConfig::default()
        };
        let agent = sys::Agent::new_configured(name, &config)
            .map_err(|e| nixl_error(format!("creating agent '{name}'"), e))?;
        let (_mems, mut params) = agent
            .get_plugin_params(BACKEND)
            .map_err(|e| nixl_error(format!("reading {BACKEND} parameters for '{name}'"), e))?;
        if self.options.ucx_threads > 0 {
            params
                .set("num_threads", &self.options.ucx_threads.to_string())
                .map_err(|e| {
                    nixl_error(format!("setting {BACKEND} num_threads for '{name}'"), e)
                })?;
        }
        agent.create_backend(BACKEND, &params).map_err(|e| {
            // The hint by the memory this transport will register.
            let mem = if self.device_memory.is_empty() {
                MemKind::Dram
            } else {
                MemKind::Vram
            };
            NixlError::Backend(format!(
                "the {BACKEND} backend of agent '{name}' did not start ({e}); {}",
                ucx_hints::backend_hint(mem, std::env::var("UCX_TLS").ok().as_deref())
            ))
        })?;
        self.agents.add(RealAgent {
            name: name.to_string(),
            handles: HandleTable::default(),
            registrations: Vec::new(),
            agent,
        })
    }

    fn agent_name(&self, agent: AgentId) -> NixlResult<String> {
        Ok(self.agents.get(agent)?.name.clone())
    }

    fn register_memory(&mut self, agent: AgentId, regions: &[MemRegion]) -> NixlResult<()> {
        self.agents.get(agent)?;
        let mut raw = Vec::with_capacity(regions.len());
        for region in regions {
            if !self.owns(region) {
                let owner = match region.mem {
                    MemKind::Dram => "any host arena attached to the transport",
                    MemKind::Vram => "device memory attached to the transport",
                };
                return Err(NixlError::InvalidParam(format!(
                    "{region} is not inside {owner}"
                )));
            }
            raw.push(RawMemory {
                addr: to_usize(region.addr, "address")?,
                len: to_usize(region.len, "length")?,
                mem: mem_type(region.mem),
                dev: region.dev.into(),
            });
        }
        let a = self.agents.get_mut(agent)?;
        let mut added = Vec::with_capacity(regions.len());
        for (region, memory) in regions.iter().zip(&raw) {
            // On failure `added` drops, deregistering this call's regions.
            let handle = a.agent.register_memory(memory, None).map_err(|e| {
                let hint = ucx_hints::registration_hint(
                    region.mem,
                    std::env::var("UCX_TLS").ok().as_deref(),
                );
                nixl_error(format!("registering {region} ({hint})"), e)
            })?;
            added.push((*region, handle));
        }
        a.registrations.extend(added);
        Ok(())
    }

    fn deregister_memory(&mut self, agent: AgentId, regions: &[MemRegion]) -> NixlResult<()> {
        let a = self.agents.get_mut(agent)?;
        let mut picked: Vec<usize> = Vec::with_capacity(regions.len());
        for region in regions {
            let at = a
                .registrations
                .iter()
                .enumerate()
                .position(|(i, (r, _))| r == region && !picked.contains(&i))
                .ok_or_else(|| {
                    NixlError::NotFound(format!(
                        "{region} is not registered with agent '{}'",
                        a.name
                    ))
                })?;
            picked.push(at);
        }
        picked.sort_unstable();
        for at in picked.into_iter().rev() {
            // Dropping the handle deregisters the region.
            a.registrations.remove(at);
        }
        Ok(())
    }

    fn local_metadata(&mut self, agent: AgentId) -> NixlResult<Vec<u8>> {
        let a = self.agents.get(agent)?;
        a.agent.get_local_md().map_err(a.err("exporting metadata"))
    }

    fn add_remote_agent(&mut self, agent: AgentId, metadata: &[u8]) -> NixlResult<String> {
        let a = self.agents.get(agent)?;
        a.agent
            .load_remote_md(metadata)
            .map_err(a.err("loading remote metadata"))
    }

    fn remove_remote_agent(&mut self, agent: AgentId, remote: &str) -> NixlResult<()> {
        let a = self.agents.get(agent)?;
        a.agent
            .invalidate_remote_md(remote)
            .map_err(a.err(&format!("removing remote agent '{remote}'")))
    }

    fn prepare_dlist(
        &mut self,
        agent: AgentId,
        target: &DlistTarget,
        mem: MemKind,
        list: &DescList,
    ) -> NixlResult<DlistHandle> {
        let a = self.agents.get(agent)?;
        let mut rows =
            sys::XferDescList::new(mem_type(mem)).map_err(a.err("creating a descriptor list"))?;
        for (id, run) in list.runs().iter().enumerate() {
            for k in 0..run.count {
                let addr = k
                    .checked_mul(run.stride)
                    .and_then(|o| run.addr.checked_add(o));
                let Some(addr) = addr.filter(|a| a.checked_add(run.len).is_some()) else {
                    return Err(NixlError::NotFound(format!(
                        "run {id} of the list runs past the end of the address space at row {k}"
                    )));
                };
                rows.add_desc(
                    to_usize(addr, "address")?,
                    to_usize(run.len, "length")?,
                    run.dev.into(),
                );
            }
        }
        let name = match target {
            DlistTarget::Local => "",
            DlistTarget::Remote(name) => name.as_str(),
        };
        let handle = a
            .agent
            .prepare_xfer_dlist(name, &rows, None)
            .map_err(a.err(&format!(
                "preparing {} descriptors against {target:?}",
                list.len()
            )))?;
        Ok(self.agents.get_mut(agent)?.handles.add_dlist(handle))
    }

    fn make_xfer_spec(&mut self, agent: AgentId, xfer: XferSpec<'_>) -> NixlResult<XferHandle> {
        let a = self.agents.get(agent)?;
        let (l, r) = a.handles.dlist_pair(xfer.local, xfer.remote)?;
        let lids = to_i32_ids(xfer.local_ids, "local")?;
        let rids = to_i32_ids(xfer.remote_ids, "remote")?;
        let args = match xfer.notification {
            Some(message) => {
                let mut args = sys::OptArgs::new().map_err(a.err("creating transfer options"))?;
                args.set_has_notification(true)
                    .and_then(|()| args.set_notification_message(message))
                    .map_err(a.err("setting the notification"))?;
                Some(args)
            }
            None => None,
        };
        let sys_op = match xfer.op {
            XferOp::Read => sys::XferOp::Read,
            XferOp::Write => sys::XferOp::Write,
        };
        let request = a
            .agent
            .make_xfer_req(sys_op, l, &lids, r, &rids, args.as_ref())
            .map_err(a.err(&format!(
                "making a {} of {} local / {} remote ids",
                xfer.op.as_str(),
                lids.len(),
                rids.len()
            )))?;
        Ok(self.agents.get_mut(agent)?.handles.add_xfer(request))
    }

    fn post_xfer(&mut self, agent: AgentId, xfer: XferHandle) -> NixlResult<XferState> {
        let a = self.agents.get(agent)?;
        let request = a.handles.xfer(xfer)?;
        let in_progress = a
            .agent
            .post_xfer_req(request, None)
            .map_err(a.err(&format!("posting transfer {}", xfer.0)))?;
        Ok(if in_progress {
            XferState::InProgress
        } else {
            XferState::Done
        })
    }

    fn xfer_state(&mut self, agent: AgentId, xfer: XferHandle) -> NixlResult<XferState> {
        let a = self.agents.get(agent)?;
        let request = a.handles.xfer(xfer)?;
        match a
            .agent
            .get_xfer_status(request)
            .map_err(a.err(&format!("polling transfer {}", xfer.0)))?
        {
            sys::XferStatus::Success => Ok(XferState::Done),
            sys::XferStatus::InProgress => Ok(XferState::InProgress),
        }
    }

    fn release_xfer(&mut self, agent: AgentId, xfer: XferHandle) -> NixlResult<()> {
        self.agents.get_mut(agent)?.handles.remove_xfer(xfer)?;
        Ok(())
    }

    fn release_dlist(&mut self, agent: AgentId, dlist: DlistHandle) -> NixlResult<()> {
        self.agents.get_mut(agent)?.handles.remove_dlist(dlist)?;
        Ok(())
    }

    fn send_notification(
        &mut self,
        agent: AgentId,
        remote: &str,
        message: &[u8],
    ) -> NixlResult<()> {
        let a = self.agents.get(agent)?;
        a.agent
            .send_notification(remote, message, None)
            .map_err(a.err(&format!("notifying '{remote}'")))
    }

    fn take_notifications(&mut self, agent: AgentId) -> NixlResult<Vec<(String, Vec<u8>)>> {
        let a = self.agents.get(agent)?;
        let mut map = sys::NotificationMap::new().map_err(a.err("creating a notification map"))?;
        a.agent
            .get_notifications(&mut map, None)
            .map_err(a.err("reading notifications"))?;
        let senders: Vec<String> = map
            .agents()
            .map(|s| s.map(str::to_string))
            .collect::<Result<_, _>>()
            .map_err(a.err("reading notification senders"))?;
        let mut out = Vec::new();
        for sender in senders {
            for message in map
                .get_notifications(&sender)
                .map_err(a.err("reading notifications"))?
            {
                out.push((
                    sender.clone(),
                    message.map_err(a.err("reading a notification"))?,
                ));
            }
        }
        Ok(out)
    }
}
