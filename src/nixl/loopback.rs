//! In-process transport: several agents in one process moving bytes between
//! host arenas with memcpy, under the rules real NIXL 1.5 enforces (checked
//! against it by `tests/transport_nixl.rs`):
//!
//! - memory is registered per agent and must lie inside an arena given to
//!   [`Loopback::attach`] (host) or `Loopback::attach_device` (VRAM, cargo
//!   feature `cuda`); VRAM without attached device memory is
//!   [`NixlError::Unsupported`];
//! - metadata is a snapshot of the agent's name and registrations at export
//!   time; loading it makes the agent a remote peer;
//! - every descriptor of a prepared list lies inside one registered region of
//!   the agent it is prepared against, else [`NixlError::NotFound`];
//! - a transfer pairs a locally prepared list with a remotely prepared one;
//!   index lists are non-empty and equally long, ids are in range and each
//!   pair has equal lengths, else [`NixlError::InvalidParam`];
//! - removing a remote agent makes lists and transfers prepared against it
//!   [`NixlError::NotFound`] (loading it again does not revive them);
//! - posting copies every pair in order (READ pulls remote -> local, WRITE
//!   pushes local -> remote), then hands the notification to the target
//!   agent under the initiator's name. Overlapping or duplicate destinations
//!   are not detected, as in NIXL. VRAM pairs move with device-to-device
//!   copies (`loopback_device.rs`), waited for before the post returns;
//!   a transfer mixing DRAM and VRAM lists is [`NixlError::Unsupported`].
//!
//! Deferred completion (off unless [`Loopback::defer_completion`] is called,
//! which the lifecycle scenarios do): a post then copies nothing and returns
//! [`XferState::InProgress`]; the caller lands the pairs one at a time, in
//! any order, with [`Loopback::deliver_pair`], and the transfer is done (its
//! notification delivered) when its last pair lands. Releasing a transfer
//! with pairs still to land is [`NixlError::InvalidParam`], as real NIXL
//! refuses to release a transfer in progress. Host memory only.

use std::collections::HashMap;
use std::sync::{RwLockReadGuard, RwLockWriteGuard};

use serde::{Deserialize, Serialize};

use super::agent_table::{AgentTable, NamedAgent};
use super::checks::{check_agent_name, check_xfer_ranges, check_xfer_sides};
use super::handle_table::HandleTable;
use super::loopback_device::{no_device_memory, DeviceCopy, DeviceSpace};
use super::{
    AgentId, DescList, DescRow, DlistHandle, DlistTarget, MemKind, MemRegion, Nixl, NixlError,
    NixlResult, XferHandle, XferOp, XferSpec, XferState,
};
use crate::memory::{ArenaBytes, HostArena};

/// Tag at the start of a loopback metadata blob.
const METADATA_FORMAT: &str = "kvgeom-loopback-metadata/1";

/// The metadata blob: who the agent is and what it had registered.
#[derive(Debug, Serialize, Deserialize)]
struct Metadata {
    format: String,
    agent: String,
    regions: Vec<MemRegion>,
}

/// Several agents in one process moving bytes between registered host memory.
///
/// All agents of one `Loopback` share its arenas; a transfer copies between
/// them on the calling thread, so [`Nixl::post_xfer`] always returns
/// [`XferState::Done`]. While a transfer runs it takes the arenas' locks
/// without waiting: a [`HostArena`] guard held across `post_xfer` makes it
/// fail with [`NixlError::Backend`] instead of deadlocking.
#[derive(Debug, Default)]
pub struct Loopback {
    /// Sorted by base address.
    arenas: Vec<HostArena>,
    device: DeviceSpace,
    agents: AgentTable<Agent>,
    /// `Some` once [`Loopback::defer_completion`] was called: the posted
    /// transfers whose pairs have not all landed, in posting order.
    deferred: Option<Vec<PendingXfer>>,
}

/// A posted transfer under deferred completion, with the pairs still to land.
#[derive(Debug)]
struct PendingXfer {
    agent: AgentId,
    xfer: XferHandle,
    landed: Vec<bool>,
}

/// One pair of a posted transfer that has not landed yet
/// ([`Loopback::pending_pairs`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PendingPair {
    /// The agent that posted the transfer.
    pub agent: AgentId,
    /// The transfer.
    pub xfer: XferHandle,
    /// The pair's index in the transfer's id lists.
    pub pair: usize,
}

#[derive(Debug, Default)]
struct Agent {
    name: String,
    regions: Vec<MemRegion>,
    remotes: HashMap<String, Remote>,
    /// Counts first-time loads of remote metadata; names each load's epoch.
    loads: u64,
    handles: HandleTable<Prepared, Xfer>,
    inbox: Vec<(String, Vec<u8>)>,
}

impl NamedAgent for Agent {
    fn name(&self) -> &str {
        &self.name
    }
}

impl Agent {
    /// The epoch a list prepared against `name` now would get: `Some(None)`
    /// for the agent's own name, `Some(Some(e))` for a loaded remote.
    fn epoch_of(&self, name: &str) -> Option<Option<u64>> {
        match self.remotes.get(name) {
            Some(remote) => Some(Some(remote.epoch)),
            None if name == self.name => Some(None),
            None => None,
        }
    }
}

#[derive(Debug)]
struct Remote {
    regions: Vec<MemRegion>,
    epoch: u64,
}

#[derive(Debug)]
struct Prepared {
    target: DlistTarget,
    /// For remote targets: the remote's epoch at preparation (`None` when
    /// the agent prepared against its own name).
    epoch: Option<u64>,
    mem: MemKind,
    list: DescList,
}

#[derive(Debug)]
struct Xfer {
    /// The agent the remote list belongs to, which receives the notification.
    remote: String,
    epoch: Option<u64>,
    notification: Option<Vec<u8>>,
    copies: Vec<CopyOp>,
    device_copies: Vec<DeviceCopy>,
    posted: bool,
}

/// A notification on its way: the agent it reaches, and what lands in
/// that agent's inbox (the sender's name, the message).
type Delivery = (AgentId, (String, Vec<u8>));

/// A byte position inside one of the loopback's arenas.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Place {
    arena: usize,
    offset: usize,
}

/// One resolved descriptor pair: `len` bytes from `src` to `dst`.
#[derive(Clone, Copy, Debug)]
struct CopyOp {
    src: Place,
    dst: Place,
    len: usize,
}

impl Loopback {
    /// A transport with no agents yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Make an arena's bytes reachable: agents may register memory inside it
    /// and transfers copy into and out of it. Attaching the same arena twice
    /// has no effect.
    pub fn attach(&mut self, arena: HostArena) {
        if self.arenas.iter().any(|a| a.same_as(&arena)) {
            return;
        }
        let at = self.arenas.partition_point(|a| a.base() <= arena.base());
        self.arenas.insert(at, arena);
    }

    /// The attached arenas, by base address.
    pub fn arenas(&self) -> &[HostArena] {
        &self.arenas
    }

    /// Make a device buffer's bytes reachable: agents may register VRAM
    /// inside it and transfers copy into and out of it on the device.
    /// Attaching the same buffer twice has no effect.
    #[cfg(feature = "cuda")]
    pub fn attach_device(&mut self, arena: crate::memory::DeviceArena) {
        self.device.attach(arena);
    }

    /// Whether `region` lies inside memory attached to this transport.
    fn holds(&self, region: &MemRegion) -> bool {
        match region.mem {
            MemKind::Dram => place(&self.arenas, region.addr, region.len).is_some(),
            MemKind::Vram => self
                .device
                .resolve(region.dev, region.addr, region.len)
                .is_some(),
        }
    }
}

impl Loopback {
    /// From now on a posted transfer moves nothing until its pairs are
    /// landed one by one with [`Loopback::deliver_pair`].
    pub fn defer_completion(&mut self) {
        self.deferred.get_or_insert_with(Vec::new);
    }

    /// Every pair posted and not landed yet, transfer by transfer in
    /// posting order (empty unless completion is deferred).
    pub fn pending_pairs(&self) -> Vec<PendingPair> {
        let Some(pending) = &self.deferred else {
            return Vec::new();
        };
        let mut pairs = Vec::new();
        for p in pending {
            for (pair, landed) in p.landed.iter().enumerate() {
                if !landed {
                    pairs.push(PendingPair {
                        agent: p.agent,
                        xfer: p.xfer,
                        pair,
                    });
                }
            }
        }
        pairs
    }

    /// Land one pair of a posted transfer (deferred completion): copy its
    /// bytes; when it is the transfer's last, the transfer is done and its
    /// notification reaches the peer. A pair that already landed is
    /// [`NixlError::InvalidParam`].
    pub fn deliver_pair(
        &mut self,
        agent: AgentId,
        xfer: XferHandle,
        pair: usize,
    ) -> NixlResult<XferState> {
        let pending = self.deferred.as_mut().ok_or_else(|| {
            NixlError::InvalidParam("completion is not deferred on this transport".into())
        })?;
        let at = pending
            .iter()
            .position(|p| p.agent == agent && p.xfer == xfer)
            .ok_or_else(|| NixlError::NotFound(format!("transfer {xfer:?} is not in progress")))?;
        if pending[at].landed.get(pair) != Some(&false) {
            return Err(NixlError::InvalidParam(format!(
                "pair {pair} of transfer {xfer:?} has landed already or does not exist"
            )));
        }
        let x = self.agents.get(agent)?.handles.xfer(xfer)?;
        run_copies(&self.arenas, &x.copies[pair..=pair])?;
        let p = &mut pending[at];
        p.landed[pair] = true;
        if p.landed.iter().any(|l| !l) {
            return Ok(XferState::InProgress);
        }
        pending.remove(at);
        let delivery = self.notification_delivery(&self.agents.get(agent)?.name, x)?;
        if let Some((target, notification)) = delivery {
            self.agents.get_mut(target)?.inbox.push(notification);
        }
        self.agents.get_mut(agent)?.handles.xfer_mut(xfer)?.posted = true;
        Ok(XferState::Done)
    }

    /// Where `x`'s notification goes and what reaches it there (`sender`,
    /// the message); `None` for a transfer without one.
    fn notification_delivery(&self, sender: &str, x: &Xfer) -> NixlResult<Option<Delivery>> {
        let Some(message) = &x.notification else {
            return Ok(None);
        };
        let target = self.agents.id_of(&x.remote).ok_or_else(|| {
            NixlError::NotFound(format!(
                "remote agent '{}' is not an agent of this transport",
                x.remote
            ))
        })?;
        Ok(Some((target, (sender.to_string(), message.clone()))))
    }

    /// Whether `xfer` has pairs still to land.
    fn in_flight(&self, agent: AgentId, xfer: XferHandle) -> bool {
        self.deferred
            .as_ref()
            .is_some_and(|d| d.iter().any(|p| p.agent == agent && p.xfer == xfer))
    }
}

/// Where `[addr, addr + len)` lies among the arenas, if entirely inside one.
fn place(arenas: &[HostArena], addr: u64, len: u64) -> Option<Place> {
    let candidates = arenas.partition_point(|a| a.base() <= addr);
    (0..candidates)
        .rev()
        .find(|&i| arenas[i].contains(addr, len))
        .and_then(|i| {
            let offset = usize::try_from(addr - arenas[i].base()).ok()?;
            Some(Place { arena: i, offset })
        })
}

/// Whether `region` holds `[addr, end)` of memory type `mem` on device `dev`.
fn covers(region: &MemRegion, mem: MemKind, dev: u32, addr: u64, end: u64) -> bool {
    region.mem == mem
        && region.dev == dev
        && region.addr <= addr
        && region
            .addr
            .checked_add(region.len)
            .is_some_and(|r_end| end <= r_end)
}

/// The first row of `list` (id, row) that no single region covers.
fn first_uncovered(list: &DescList, regions: &[MemRegion], mem: MemKind) -> Option<(u64, DescRow)> {
    let covered = |dev: u32, addr: Option<u64>, len: u64| {
        let end = addr.and_then(|a| a.checked_add(len));
        match (addr, end) {
            (Some(addr), Some(end)) => regions.iter().any(|r| covers(r, mem, dev, addr, end)),
            _ => false,
        }
    };
    let mut first_id = 0u64;
    for run in list.runs() {
        let row_addr = |k: u64| {
            k.checked_mul(run.stride)
                .and_then(|o| run.addr.checked_add(o))
        };
        // Rows of a run ascend; a region covering the span from the first
        // row's start to the last row's end covers every row.
        let Some(last) = run.count.checked_sub(1) else {
            continue;
        };
        let last_end = row_addr(last).and_then(|a| a.checked_add(run.len));
        let whole = last_end.is_some_and(|end| {
            regions
                .iter()
                .any(|r| covers(r, mem, run.dev, run.addr, end))
        });
        if !whole {
            for k in 0..run.count {
                if !covered(run.dev, row_addr(k), run.len) {
                    let row = DescRow {
                        addr: row_addr(k).unwrap_or(u64::MAX),
                        len: run.len,
                        dev: run.dev,
                    };
                    return Some((first_id + k, row));
                }
            }
        }
        first_id += run.count;
    }
    None
}

/// Arena locks held for the duration of one posted transfer.
enum Guard<'a> {
    Unused,
    Read(RwLockReadGuard<'a, ArenaBytes>),
    Write(RwLockWriteGuard<'a, ArenaBytes>),
}

impl Guard<'_> {
    fn bytes(&self) -> &[u8] {
        match self {
            Guard::Unused => &[],
            Guard::Read(g) => g,
            Guard::Write(g) => g,
        }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        match self {
            Guard::Unused | Guard::Read(_) => &mut [],
            Guard::Write(g) => g,
        }
    }
}

fn arena_busy(arena: &HostArena) -> NixlError {
    NixlError::Backend(format!(
        "host arena at {:#x} is borrowed elsewhere (a HostArena read or write guard is alive) \
         while a transfer copies through it",
        arena.base()
    ))
}

fn out_of_arena(op: &CopyOp) -> NixlError {
    NixlError::Backend(format!(
        "internal: copy of {} bytes from arena {} offset {} to arena {} offset {} leaves its arena",
        op.len, op.src.arena, op.src.offset, op.dst.arena, op.dst.offset
    ))
}

/// Copy every pair in order, holding each involved arena's lock once.
fn run_copies(arenas: &[HostArena], copies: &[CopyOp]) -> NixlResult<()> {
    let mut written = vec![None::<bool>; arenas.len()];
    for op in copies {
        written[op.dst.arena] = Some(true);
        written[op.src.arena].get_or_insert(false);
    }
    let mut guards = Vec::with_capacity(arenas.len());
    for (arena, use_) in arenas.iter().zip(&written) {
        guards.push(match use_ {
            None => Guard::Unused,
            Some(false) => Guard::Read(arena.try_read().ok_or_else(|| arena_busy(arena))?),
            Some(true) => Guard::Write(arena.try_write().ok_or_else(|| arena_busy(arena))?),
        });
    }
    for op in copies {
        let (src_end, dst_end) = (op.src.offset + op.len, op.dst.offset + op.len);
        if op.src.arena == op.dst.arena {
            let bytes = guards[op.dst.arena].bytes_mut();
            if src_end > bytes.len() || dst_end > bytes.len() {
                return Err(out_of_arena(op));
            }
            bytes.copy_within(op.src.offset..src_end, op.dst.offset);
        } else {
            let (src, dst) = if op.src.arena < op.dst.arena {
                let (lo, hi) = guards.split_at_mut(op.dst.arena);
                (&lo[op.src.arena], &mut hi[0])
            } else {
                let (lo, hi) = guards.split_at_mut(op.src.arena);
                (&hi[0], &mut lo[op.dst.arena])
            };
            let from = src.bytes().get(op.src.offset..src_end);
            let to = dst.bytes_mut().get_mut(op.dst.offset..dst_end);
            match (from, to) {
                (Some(from), Some(to)) => to.copy_from_slice(from),
                _ => return Err(out_of_arena(op)),
            }
        }
    }
    Ok(())
}

fn stale_remote(name: &str) -> NixlError {
    NixlError::NotFound(format!(
        "remote agent '{name}' was removed after the list was prepared; load its metadata and \
         prepare the list again"
    ))
}

impl Nixl for Loopback {
    fn create_agent(&mut self, name: &str) -> NixlResult<AgentId> {
        self.agents.check_new_name(name)?;
        self.agents.add(Agent {
            name: name.to_string(),
            ..Agent::default()
        })
    }

    fn agent_name(&self, agent: AgentId) -> NixlResult<String> {
        Ok(self.agents.get(agent)?.name.clone())
    }

    fn register_memory(&mut self, agent: AgentId, regions: &[MemRegion]) -> NixlResult<()> {
        self.agents.get(agent)?;
        for region in regions {
            if region.mem == MemKind::Vram && self.device.is_empty() {
                return Err(NixlError::Unsupported(format!(
                    "{}; cannot register {region}",
                    no_device_memory()
                )));
            }
            if !self.holds(region) {
                let owner = match region.mem {
                    MemKind::Dram => "any host arena",
                    MemKind::Vram => "any device buffer",
                };
                return Err(NixlError::InvalidParam(format!(
                    "{region} is not inside {owner} attached to the transport"
                )));
            }
        }
        self.agents
            .get_mut(agent)?
            .regions
            .extend_from_slice(regions);
        Ok(())
    }

    fn deregister_memory(&mut self, agent: AgentId, regions: &[MemRegion]) -> NixlResult<()> {
        let a = self.agents.get_mut(agent)?;
        let mut remaining = a.regions.clone();
        for region in regions {
            let at = remaining.iter().position(|r| r == region).ok_or_else(|| {
                NixlError::NotFound(format!(
                    "{region} is not registered with agent '{}'",
                    a.name
                ))
            })?;
            remaining.remove(at);
        }
        a.regions = remaining;
        Ok(())
    }

    fn local_metadata(&mut self, agent: AgentId) -> NixlResult<Vec<u8>> {
        let a = self.agents.get(agent)?;
        let metadata = Metadata {
            format: METADATA_FORMAT.to_string(),
            agent: a.name.clone(),
            regions: a.regions.clone(),
        };
        serde_json::to_vec(&metadata)
            .map_err(|e| NixlError::Backend(format!("cannot serialize metadata: {e}")))
    }

    fn add_remote_agent(&mut self, agent: AgentId, metadata: &[u8]) -> NixlResult<String> {
        self.agents.get(agent)?;
        if metadata.is_empty() {
            return Err(NixlError::InvalidParam("remote metadata is empty".into()));
        }
        let parsed: Metadata = serde_json::from_slice(metadata)
            .ok()
            .filter(|m: &Metadata| m.format == METADATA_FORMAT)
            .ok_or_else(|| {
                NixlError::Backend(format!(
                    "remote metadata ({} bytes) is not a loopback agent's metadata",
                    metadata.len()
                ))
            })?;
        check_agent_name(&parsed.agent)?;
        if let Some(outside) = parsed.regions.iter().find(|r| !self.holds(r)) {
            return Err(NixlError::InvalidParam(format!(
                "remote agent '{}' advertises {outside} outside this transport's memory",
                parsed.agent
            )));
        }
        let a = self.agents.get_mut(agent)?;
        if parsed.agent == a.name {
            return Err(NixlError::InvalidParam(format!(
                "agent '{}' cannot load its own metadata",
                a.name
            )));
        }
        match a.remotes.get_mut(&parsed.agent) {
            Some(remote) => remote.regions = parsed.regions,
            None => {
                a.loads += 1;
                let epoch = a.loads;
                a.remotes.insert(
                    parsed.agent.clone(),
                    Remote {
                        regions: parsed.regions,
                        epoch,
                    },
                );
            }
        }
        Ok(parsed.agent)
    }

    fn remove_remote_agent(&mut self, agent: AgentId, remote: &str) -> NixlResult<()> {
        let a = self.agents.get_mut(agent)?;
        a.remotes.remove(remote).map(|_| ()).ok_or_else(|| {
            NixlError::InvalidParam(format!(
                "agent '{}' has no metadata loaded for '{remote}'",
                a.name
            ))
        })
    }

    fn prepare_dlist(
        &mut self,
        agent: AgentId,
        target: &DlistTarget,
        mem: MemKind,
        list: &DescList,
    ) -> NixlResult<DlistHandle> {
        let a = self.agents.get(agent)?;
        if mem == MemKind::Vram && self.device.is_empty() {
            return Err(NixlError::Unsupported(format!(
                "{}; cannot prepare a {mem:?} list",
                no_device_memory()
            )));
        }
        let (regions, epoch, owner) = match target {
            DlistTarget::Local => (&a.regions, None, a.name.as_str()),
            DlistTarget::Remote(name) => match (a.remotes.get(name), a.epoch_of(name)) {
                (Some(remote), _) => (&remote.regions, Some(remote.epoch), name.as_str()),
                (None, Some(None)) => (&a.regions, None, name.as_str()),
                _ => {
                    return Err(NixlError::NotFound(format!(
                        "agent '{}' has no metadata loaded for remote agent '{name}'",
                        a.name
                    )))
                }
            },
        };
        if list.is_empty() {
            return Err(NixlError::NotFound(format!(
                "empty descriptor list prepared against '{owner}'"
            )));
        }
        if let Some((id, row)) = first_uncovered(list, regions, mem) {
            return Err(NixlError::NotFound(format!(
                "descriptor {id} ({:#x}+{}, dev {}) does not lie inside one registered {mem:?} \
                 region of agent '{owner}'",
                row.addr, row.len, row.dev
            )));
        }
        let prepared = Prepared {
            target: target.clone(),
            epoch,
            mem,
            list: list.clone(),
        };
        Ok(self.agents.get_mut(agent)?.handles.add_dlist(prepared))
    }

    fn make_xfer_spec(&mut self, agent: AgentId, xfer: XferSpec<'_>) -> NixlResult<XferHandle> {
        let a = self.agents.get(agent)?;
        let (l, r) = a.handles.dlist_pair(xfer.local, xfer.remote)?;
        check_xfer_sides(&l.target, xfer.local_ids, &r.target, xfer.remote_ids)?;
        let remote_name = match &r.target {
            DlistTarget::Remote(name) => name.clone(),
            DlistTarget::Local => a.name.clone(),
        };
        if a.epoch_of(&remote_name) != Some(r.epoch) {
            return Err(stale_remote(&remote_name));
        }
        check_xfer_ranges(l.list.len(), xfer.local_ids, r.list.len(), xfer.remote_ids)?;
        if l.mem != r.mem {
            return Err(NixlError::Unsupported(format!(
                "the loopback transport does not move bytes between a {:?} and a {:?} list",
                l.mem, r.mem
            )));
        }

        let mut copies = Vec::new();
        let mut device_copies = Vec::new();
        for (pair, (&li, &ri)) in xfer.local_ids.iter().zip(xfer.remote_ids).enumerate() {
            let (Some(lrow), Some(rrow)) = (l.list.get(li.into()), r.list.get(ri.into())) else {
                return Err(NixlError::InvalidParam(format!(
                    "pair {pair}: id {li} or {ri} out of range"
                )));
            };
            if lrow.len != rrow.len {
                return Err(NixlError::InvalidParam(format!(
                    "pair {pair}: local id {li} has {} bytes but remote id {ri} has {}",
                    lrow.len, rrow.len
                )));
            }
            let unplaced = |row: DescRow| {
                NixlError::NotFound(format!(
                    "descriptor {:#x}+{} is no longer inside attached memory",
                    row.addr, row.len
                ))
            };
            if l.mem == MemKind::Vram {
                let lp = self
                    .device
                    .resolve(lrow.dev, lrow.addr, lrow.len)
                    .ok_or_else(|| unplaced(lrow))?;
                let rp = self
                    .device
                    .resolve(rrow.dev, rrow.addr, rrow.len)
                    .ok_or_else(|| unplaced(rrow))?;
                let (src, dst) = match xfer.op {
                    XferOp::Write => (lp, rp),
                    XferOp::Read => (rp, lp),
                };
                device_copies.push(DeviceCopy {
                    src,
                    dst,
                    len: lrow.len,
                });
                continue;
            }
            let lp = place(&self.arenas, lrow.addr, lrow.len).ok_or_else(|| unplaced(lrow))?;
            let rp = place(&self.arenas, rrow.addr, rrow.len).ok_or_else(|| unplaced(rrow))?;
            for (p, row) in [(lp, lrow), (rp, rrow)] {
                let arena = &self.arenas[p.arena];
                if !arena.is_backed() {
                    arena.note_unbacked_access();
                    return Err(NixlError::NotFound(format!(
                        "descriptor {:#x}+{} lies in a rank's memory that was not allocated \
                         (no transfer was expected to touch it)",
                        row.addr, row.len
                    )));
                }
            }
            let len = usize::try_from(lrow.len)
                .map_err(|_| NixlError::InvalidParam(format!("pair {pair} is too long")))?;
            let (src, dst) = match xfer.op {
                XferOp::Write => (lp, rp),
                XferOp::Read => (rp, lp),
            };
            copies.push(CopyOp { src, dst, len });
        }
        let xfer = Xfer {
            remote: remote_name,
            epoch: r.epoch,
            notification: xfer.notification.map(<[u8]>::to_vec),
            copies,
            device_copies,
            posted: false,
        };
        Ok(self.agents.get_mut(agent)?.handles.add_xfer(xfer))
    }

    fn post_xfer(&mut self, agent: AgentId, xfer: XferHandle) -> NixlResult<XferState> {
        let a = self.agents.get(agent)?;
        let x = a.handles.xfer(xfer)?;
        if a.epoch_of(&x.remote) != Some(x.epoch) {
            return Err(stale_remote(&x.remote));
        }
        let delivery = self.notification_delivery(&a.name, x)?;
        if let Some(pending) = &mut self.deferred {
            if !x.device_copies.is_empty() {
                return Err(NixlError::Unsupported(
                    "deferred completion moves host memory only".into(),
                ));
            }
            if pending.iter().any(|p| p.agent == agent && p.xfer == xfer) {
                return Err(NixlError::InvalidParam(format!(
                    "transfer {xfer:?} is still in progress"
                )));
            }
            if !x.copies.is_empty() {
                pending.push(PendingXfer {
                    agent,
                    xfer,
                    landed: vec![false; x.copies.len()],
                });
                return Ok(XferState::InProgress);
            }
        }
        run_copies(&self.arenas, &x.copies)?;
        self.device.run(&x.device_copies)?;
        if let Some((target, notification)) = delivery {
            self.agents.get_mut(target)?.inbox.push(notification);
        }
        self.agents.get_mut(agent)?.handles.xfer_mut(xfer)?.posted = true;
        Ok(XferState::Done)
    }

    fn xfer_state(&mut self, agent: AgentId, xfer: XferHandle) -> NixlResult<XferState> {
        Ok(if self.agents.get(agent)?.handles.xfer(xfer)?.posted {
            XferState::Done
        } else {
            XferState::InProgress
        })
    }

    fn release_xfer(&mut self, agent: AgentId, xfer: XferHandle) -> NixlResult<()> {
        if self.in_flight(agent, xfer) {
            return Err(NixlError::InvalidParam(format!(
                "transfer {xfer:?} is in progress: pairs are still to land"
            )));
        }
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
        if a.epoch_of(remote).is_none() {
            return Err(NixlError::NotFound(format!(
                "agent '{}' has no metadata loaded for '{remote}'",
                a.name
            )));
        }
        let from = a.name.clone();
        let target = self.agents.id_of(remote).ok_or_else(|| {
            NixlError::NotFound(format!("'{remote}' is not an agent of this transport"))
        })?;
        self.agents
            .get_mut(target)?
            .inbox
            .push((from, message.to_vec()));
        Ok(())
    }

    fn take_notifications(&mut self, agent: AgentId) -> NixlResult<Vec<(String, Vec<u8>)>> {
        Ok(std::mem::take(&mut self.agents.get_mut(agent)?.inbox))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn place_finds_the_arena_holding_a_whole_range() {
        let a = HostArena::new(64);
        let b = HostArena::new(64);
        let mut t = Loopback::new();
        t.attach(a.clone());
        t.attach(b.clone());
        t.attach(a.clone());
        assert_eq!(t.arenas().len(), 2);
        let ia = t.arenas().iter().position(|x| x.same_as(&a)).unwrap();
        assert_eq!(
            place(t.arenas(), a.base() + 8, 56),
            Some(Place {
                arena: ia,
                offset: 8
            })
        );
        assert_eq!(place(t.arenas(), a.base() + 8, 57), None);
        assert_eq!(place(t.arenas(), u64::MAX, 1), None);
    }

    #[test]
    fn a_run_is_checked_row_by_row_when_no_region_spans_it() {
        let regions = [
            MemRegion {
                addr: 1000,
                len: 100,
                mem: MemKind::Dram,
                dev: 0,
            },
            MemRegion {
                addr: 1100,
                len: 100,
                mem: MemKind::Dram,
                dev: 0,
            },
        ];
        // Rows at 1000, 1100: each inside its own region.
        let ok = DescList::from_runs([super::super::StridedRun {
            addr: 1000,
            len: 100,
            dev: 0,
            stride: 100,
            count: 2,
        }]);
        assert_eq!(first_uncovered(&ok, &regions, MemKind::Dram), None);
        // Row 1 at 1150 straddles both regions.
        let straddling = DescList::from_runs([super::super::StridedRun {
            addr: 1000,
            len: 100,
            dev: 0,
            stride: 150,
            count: 2,
        }]);
        assert_eq!(
            first_uncovered(&straddling, &regions, MemKind::Dram),
            Some((
                1,
                DescRow {
                    addr: 1150,
                    len: 100,
                    dev: 0
                }
            ))
        );
        // A stride that overflows the address space is never covered.
        let overflowing = DescList::from_runs([super::super::StridedRun {
            addr: 1000,
            len: 1,
            dev: 0,
            stride: u64::MAX,
            count: 2,
        }]);
        assert_eq!(
            first_uncovered(&overflowing, &regions, MemKind::Dram),
            Some((
                1,
                DescRow {
                    addr: u64::MAX,
                    len: 1,
                    dev: 0
                }
            ))
        );
    }

    /// Two agents on two arenas, decode ("d") with prefill's ("p")
    /// metadata loaded, and a READ of two 4-byte pairs posted by decode
    /// with a notification.
    fn two_pair_read(deferred: bool) -> (Loopback, HostArena, AgentId, AgentId, XferHandle) {
        let (pa, da) = (HostArena::new(8), HostArena::new(8));
        pa.write().copy_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
        let mut t = Loopback::new();
        if deferred {
            t.defer_completion();
        }
        t.attach(pa.clone());
        t.attach(da.clone());
        let p = t.create_agent("p").unwrap();
        let d = t.create_agent("d").unwrap();
        let region = |a: &HostArena| MemRegion {
            addr: a.base(),
            len: 8,
            mem: MemKind::Dram,
            dev: 0,
        };
        t.register_memory(p, &[region(&pa)]).unwrap();
        t.register_memory(d, &[region(&da)]).unwrap();
        let meta = t.local_metadata(p).unwrap();
        t.add_remote_agent(d, &meta).unwrap();
        let rows = |a: &HostArena| {
            DescList::from_rows((0..2).map(|i| DescRow {
                addr: a.base() + 4 * i,
                len: 4,
                dev: 0,
            }))
        };
        let l = t
            .prepare_dlist(d, &DlistTarget::Local, MemKind::Dram, &rows(&da))
            .unwrap();
        let r = t
            .prepare_dlist(
                d,
                &DlistTarget::Remote("p".into()),
                MemKind::Dram,
                &rows(&pa),
            )
            .unwrap();
        let x = t
            .make_xfer(d, XferOp::Read, l, &[0, 1], r, &[0, 1], Some(b"done"))
            .unwrap();
        (t, da, p, d, x)
    }

    #[test]
    fn without_deferral_a_post_completes_at_once() {
        let (mut t, da, p, d, x) = two_pair_read(false);
        assert_eq!(t.post_xfer(d, x).unwrap(), XferState::Done);
        assert_eq!(&da.read()[..], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(t.take_notifications(p).unwrap().len(), 1);
        assert!(t.pending_pairs().is_empty());
        assert!(t.deliver_pair(d, x, 0).is_err());
    }

    #[test]
    fn deferred_pairs_land_one_by_one_in_any_order() {
        let (mut t, da, p, d, x) = two_pair_read(true);
        assert_eq!(t.post_xfer(d, x).unwrap(), XferState::InProgress);
        assert_eq!(&da.read()[..], &[0; 8], "nothing moves at the post");
        assert_eq!(t.pending_pairs().len(), 2);
        assert!(
            t.release_xfer(d, x).is_err(),
            "a transfer in flight is not released"
        );
        assert_eq!(t.deliver_pair(d, x, 1).unwrap(), XferState::InProgress);
        assert_eq!(&da.read()[..], &[0, 0, 0, 0, 5, 6, 7, 8]);
        assert!(t.take_notifications(p).unwrap().is_empty());
        assert!(t.deliver_pair(d, x, 1).is_err(), "a pair lands once");
        assert_eq!(t.xfer_state(d, x).unwrap(), XferState::InProgress);
        assert_eq!(t.deliver_pair(d, x, 0).unwrap(), XferState::Done);
        assert_eq!(&da.read()[..], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(t.xfer_state(d, x).unwrap(), XferState::Done);
        assert_eq!(
            t.take_notifications(p).unwrap(),
            vec![("d".to_string(), b"done".to_vec())]
        );
        t.release_xfer(d, x).unwrap();
    }
}
