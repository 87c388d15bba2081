//! One trace file as a test case: the inputs a replay needs to rebuild the
//! same worker and request, and the expected descriptor lists and transfers
//! to compare a run against.
//!
//! Replay inputs, in the order a replay uses them:
//! - [`TraceCase::worker`]: local logical block, kernel block, logical block
//!   count, TP size and rank (plus [`TraceCase::case_args`] for sweep cases);
//! - [`TraceCase::local_regions`] and [`TraceCase::local_geometry`]: what the
//!   local worker registered and derived (block lengths and strides per
//!   region, ppl, MLA and SSM region flags, mamba `(conv, ssm)` sizes);
//! - [`TraceCase::remotes`]: one handshake per remote rank (TP rank and size,
//!   the metadata the rank sent);
//! - [`TraceCase::request`]: the request's block ids per KV-cache group.
//!
//! Expected answers: [`TraceCase::dlists`] in preparation order,
//! [`TraceCase::xfers`] in order, [`TraceCase::request_done`] (ids after the
//! read) and [`TraceCase::result`].

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::error::{TraceError, TraceErrorKind};
use super::format::{
    AddRemoteAgent, CaseArgs, DlistEvent, Meta, RemoteArgs, RemoteMeta, RequestDone, RequestEvent,
    ResultEvent, TraceEvent, TraceRegion, WorkerArgs, WorkerGeometry, LOCAL_TARGET,
};
use super::normalize::{NormRow, Region, RegionMap};
use super::reader::TraceLine;
use crate::limits::MAX_TP_SIZE;
use crate::nixl::{DescList, DlistHandle, DlistTarget, MemKind, XferHandle, XferOp};

/// What a prepared list is for, as far as the trace tells.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum ListRole {
    /// A local list prepared at registration (before `local_geometry`).
    Local,
    /// A local list prepared later, at a handshake (TP split or block-size view).
    Split,
    /// The list of remote rank `tp_rank` (`remote` indexes [`TraceCase::remotes`]).
    Remote {
        /// Index in [`TraceCase::remotes`].
        remote: usize,
        /// The remote rank.
        tp_rank: u32,
    },
}

impl fmt::Display for ListRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ListRole::Local => f.write_str("local"),
            ListRole::Split => f.write_str("split"),
            ListRole::Remote { tp_rank, .. } => write!(f, "remote rank {tp_rank}"),
        }
    }
}

/// One expected descriptor list.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ExpectedDlist {
    /// Line of the `dlist` event.
    pub line: usize,
    /// The handle vLLM got.
    pub handle: DlistHandle,
    /// Whose memory the rows address.
    pub target: DlistTarget,
    /// The memory type it was prepared with.
    pub mem: MemKind,
    /// The rows, as recorded.
    pub list: DescList,
    /// What the list is for.
    pub role: ListRole,
}

impl ExpectedDlist {
    /// The target as vLLM names it (`NIXL_INIT_AGENT` or the remote agent).
    pub fn target_name(&self) -> &str {
        match &self.target {
            DlistTarget::Local => LOCAL_TARGET,
            DlistTarget::Remote(name) => name,
        }
    }
}

/// One expected transfer. Pair `i` moves local row `local_ids[i]` of list
/// `local_list` and remote row `remote_ids[i]` of list `remote_list`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ExpectedXfer {
    /// Line of the `xfer` event.
    pub line: usize,
    /// The handle vLLM got.
    pub handle: XferHandle,
    /// READ or WRITE.
    pub op: XferOp,
    /// The local list's handle.
    pub local_handle: DlistHandle,
    /// Index of the local list in [`TraceCase::dlists`].
    pub local_list: usize,
    /// Rows of the local list, one per pair.
    pub local_ids: Vec<u32>,
    /// The remote list's handle.
    pub remote_handle: DlistHandle,
    /// Index of the remote list in [`TraceCase::dlists`].
    pub remote_list: usize,
    /// Rows of the remote list, paired index by index with `local_ids`.
    pub remote_ids: Vec<u32>,
    /// The notification delivered on completion, if any.
    pub notif_msg: Option<String>,
}

/// One remote rank's handshake.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RemoteRank {
    /// Line of the `add_remote_agent` event.
    pub line: usize,
    /// The remote rank.
    pub tp_rank: u32,
    /// The remote engine's TP size.
    pub tp_size: u32,
    /// The remote engine's decode context parallel size.
    pub dcp_size: u32,
    /// The remote agent name (the dlist target of this rank's list).
    pub agent_name: String,
    /// What the rank sent: engine id, region bases, device, block counts,
    /// lengths and strides, layout, kernel block size, ssm sizes, ppl.
    pub meta: RemoteMeta,
    /// Index in [`TraceCase::dlists`] of this rank's remote list.
    pub dlist: Option<usize>,
    /// The remote's kernel block count, when the event carries one.
    pub dst_num_blocks: Option<u64>,
    /// The remote's kernel block count per region, when the event carries them.
    pub dst_region_num_blocks: Option<Vec<u64>>,
    /// What vLLM raised when it refused this handshake (`None`: accepted).
    pub refused: Option<String>,
}

impl RemoteRank {
    /// The rank's regions for normalisation: each `kv_caches_base_addr`
    /// extends up to the next higher base. The metadata's block counts and
    /// strides (`RemoteMeta::region_lens`) are not a bound: vLLM's remote
    /// lists may end past them (its synthetic P in the (24, 4) sweep cases has
    /// a 56-byte mamba state in 48-byte blocks).
    pub fn region_map(&self) -> RegionMap {
        RegionMap::new(
            self.meta
                .kv_caches_base_addr
                .iter()
                .map(|&base| Region::unbounded(base))
                .collect(),
        )
    }
}

/// Everything one trace file says about one case.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TraceCase {
    /// File name without `.jsonl` / `.jsonl.gz`.
    pub name: String,
    /// The file read.
    pub path: PathBuf,
    /// Test node id, test name, pytest params, vLLM version.
    pub meta: Meta,
    /// The sweep helper's arguments (absent for fixed-id tests).
    pub case_args: Option<CaseArgs>,
    /// The local worker's configuration (`make_worker`).
    pub worker: WorkerArgs,
    /// The trace's recording agent number for the local worker.
    pub agent: u32,
    /// Regions the local worker registered, in region-index order.
    pub local_regions: Vec<TraceRegion>,
    /// What the local worker derived at registration.
    pub local_geometry: WorkerGeometry,
    /// The synthetic remote engine's arguments, when the test built one.
    pub remote_args: Option<RemoteArgs>,
    /// Every remote rank's handshake, in trace order.
    pub remotes: Vec<RemoteRank>,
    /// The request's block ids.
    pub request: RequestEvent,
    /// Every prepared list, in preparation order.
    pub dlists: Vec<ExpectedDlist>,
    /// Every transfer, in order.
    pub xfers: Vec<ExpectedXfer>,
    /// The request's ids after the read, when recorded.
    pub request_done: Option<RequestDone>,
    /// How the test ended.
    pub result: ResultEvent,
    /// The local worker's Python class (`local_geometry.worker_cls`).
    pub worker_class: String,
    /// The line of each event's first occurrence, by `ev`.
    pub event_lines: BTreeMap<&'static str, usize>,
}

/// Stores a once-only event, refusing a second one.
fn once<T>(
    slot: &mut Option<T>,
    value: T,
    line: &TraceLine,
    err: &dyn Fn(Option<usize>, TraceErrorKind) -> TraceError,
) -> Result<(), TraceError> {
    if slot.is_some() {
        return Err(err(
            Some(line.line),
            TraceErrorKind::DuplicateEvent(line.event.name()),
        ));
    }
    *slot = Some(value);
    Ok(())
}

impl TraceCase {
    /// Extract the case from lines read from `path`, before its counts and
    /// fields are checked (`TraceCase::from_lines` does both).
    pub(crate) fn extract(path: &Path, lines: &[TraceLine]) -> Result<Self, TraceError> {
        let err = |line: Option<usize>, kind| TraceError::new(path, line, kind);
        let mut meta = None;
        let mut case_args = None;
        let mut worker = None;
        let mut regions = None;
        let mut geometry = None;
        let mut remote_args = None;
        let mut request = None;
        let mut request_done = None;
        let mut result = None;
        let mut agent: Option<u32> = None;
        let mut dlists: Vec<ExpectedDlist> = Vec::new();
        let mut by_handle: HashMap<DlistHandle, usize> = HashMap::new();
        let mut remote_events: Vec<(usize, AddRemoteAgent)> = Vec::new();
        let mut xfers = Vec::new();
        let mut event_lines = BTreeMap::new();
        let mut worker_class = String::new();

        for line in lines {
            event_lines.entry(line.event.name()).or_insert(line.line);
            if let Some(found) = line.event.agent() {
                match agent {
                    None => agent = Some(found),
                    Some(expected) if expected != found => {
                        return Err(err(
                            Some(line.line),
                            TraceErrorKind::SeveralAgents { expected, found },
                        ))
                    }
                    Some(_) => {}
                }
            }
            match &line.event {
                TraceEvent::Meta(m) => once(&mut meta, m.clone(), line, &err)?,
                TraceEvent::Case(c) => once(&mut case_args, c.args.clone(), line, &err)?,
                TraceEvent::MakeWorker(w) => {
                    check_worker(&w.args).map_err(|kind| err(Some(line.line), kind))?;
                    once(&mut worker, w.args.clone(), line, &err)?
                }
                TraceEvent::NixlAgent(_) => {}
                TraceEvent::RegisterMemory(r) => once(&mut regions, r.regions.clone(), line, &err)?,
                TraceEvent::Dlist(d) => {
                    let role = if geometry.is_none() {
                        ListRole::Local
                    } else {
                        ListRole::Split
                    };
                    if by_handle.insert(d.handle, dlists.len()).is_some() {
                        return Err(err(
                            Some(line.line),
                            TraceErrorKind::DuplicateHandle(d.handle.0),
                        ));
                    }
                    let DlistEvent {
                        handle,
                        target,
                        mem,
                        list,
                        ..
                    } = d.clone();
                    dlists.push(ExpectedDlist {
                        line: line.line,
                        handle,
                        target,
                        mem,
                        list,
                        role,
                    });
                }
                TraceEvent::LocalGeometry(g) => {
                    let Some(geo) = &g.geometry else {
                        return Err(err(
                            Some(line.line),
                            TraceErrorKind::BadEvent {
                                ev: "local_geometry",
                                message: format!(
                                    "no geometry (worker raised {})",
                                    g.exception.clone().unwrap_or_default()
                                ),
                            },
                        ));
                    };
                    worker_class.clone_from(&g.worker_cls);
                    once(&mut geometry, geo.clone(), line, &err)?
                }
                TraceEvent::MakeRemoteMeta(m) => {
                    once(&mut remote_args, m.args.clone(), line, &err)?
                }
                TraceEvent::AddRemoteAgent(a) => {
                    check_remote(a).map_err(|kind| err(Some(line.line), kind))?;
                    remote_events.push((line.line, a.clone()))
                }
                TraceEvent::Request(r) => {
                    check_request(r).map_err(|kind| err(Some(line.line), kind))?;
                    once(&mut request, (line.line, r.clone()), line, &err)?
                }
                TraceEvent::Xfer(x) => {
                    let find = |side: &'static str, handle: DlistHandle| {
                        by_handle.get(&handle).copied().ok_or_else(|| {
                            err(
                                Some(line.line),
                                TraceErrorKind::UnknownHandle {
                                    side,
                                    handle: handle.0,
                                },
                            )
                        })
                    };
                    xfers.push(ExpectedXfer {
                        line: line.line,
                        handle: x.handle,
                        op: x.op,
                        local_handle: x.local_handle,
                        local_list: find("local", x.local_handle)?,
                        local_ids: x.local_ids.clone(),
                        remote_handle: x.remote_handle,
                        remote_list: find("remote", x.remote_handle)?,
                        remote_ids: x.remote_ids.clone(),
                        notif_msg: x.notif_msg.clone(),
                    });
                }
                TraceEvent::RequestDone(r) => once(&mut request_done, r.clone(), line, &err)?,
                TraceEvent::Result(r) => once(&mut result, r.clone(), line, &err)?,
            }
        }

        let remotes = link_remotes(path, &mut dlists, &by_handle, remote_events)?;
        let need = |name: &'static str| err(None, TraceErrorKind::MissingEvent(name));
        let Some((request_line, request)) = request else {
            // vLLM refused a handshake before any read: no request to judge.
            if let Some((line, why)) = remotes
                .iter()
                .find_map(|r| r.refused.as_ref().map(|why| (r.line, why)))
            {
                return Err(err(Some(line), handshake_refused(why)));
            }
            return Err(need("request"));
        };
        let worker = worker.ok_or_else(|| need("make_worker"))?;
        in_pools(&request, &worker, &remotes).map_err(|kind| err(Some(request_line), kind))?;
        Ok(TraceCase {
            name: case_name(path),
            path: path.to_path_buf(),
            meta: meta.ok_or_else(|| need("meta"))?,
            case_args,
            worker,
            agent: agent.unwrap_or(0),
            local_regions: regions.ok_or_else(|| need("register_memory"))?,
            local_geometry: geometry.ok_or_else(|| need("local_geometry"))?,
            remote_args,
            remotes,
            request,
            dlists,
            xfers,
            request_done,
            result: result.ok_or_else(|| need("result"))?,
            worker_class,
            event_lines,
        })
    }

    /// The local regions as registered.
    pub fn local_region_map(&self) -> RegionMap {
        RegionMap::new(
            self.local_regions
                .iter()
                .map(|r| Region {
                    base: r.addr,
                    len: r.len,
                })
                .collect(),
        )
    }

    /// Byte length of each local region.
    pub fn local_region_lens(&self) -> Vec<u64> {
        self.local_regions.iter().map(|r| r.len).collect()
    }

    /// The regions expected list `index` is normalised against: the local
    /// regions, or its remote rank's.
    pub fn region_map_of(&self, index: usize) -> RegionMap {
        match self.dlists.get(index).map(|d| d.role) {
            Some(ListRole::Remote { remote, .. }) => self.remotes[remote].region_map(),
            _ => self.local_region_map(),
        }
    }

    /// Expected list `index`, normalised and expanded (desc ids index it).
    pub fn normalized_rows(&self, index: usize) -> Vec<NormRow> {
        let map = self.region_map_of(index);
        self.dlists
            .get(index)
            .map(|d| d.list.rows().map(|r| map.normalize(r)).collect())
            .unwrap_or_default()
    }

    /// `"split, target NIXL_INIT_AGENT"`: how reports name list `index`.
    pub fn list_label(&self, index: usize) -> String {
        self.dlists.get(index).map_or_else(
            || "not in the trace".to_string(),
            |d| format!("{}, target {}", d.role, d.target_name()),
        )
    }
}

/// `value` of `ev`'s `field` must be at least 1.
fn nonzero(ev: &'static str, field: &'static str, value: u32) -> Result<(), TraceErrorKind> {
    if value == 0 {
        return Err(TraceErrorKind::ZeroField { ev, field });
    }
    Ok(())
}

/// `value` of `ev`'s `field` must be at most `limit`.
fn at_most(
    ev: &'static str,
    field: &'static str,
    value: u64,
    limit: u64,
) -> Result<(), TraceErrorKind> {
    if value > limit {
        return Err(TraceErrorKind::OutOfRange {
            ev,
            field,
            value,
            limit,
        });
    }
    Ok(())
}

/// A TP size: from 1 to [`MAX_TP_SIZE`].
fn tp_size(ev: &'static str, field: &'static str, value: u32) -> Result<(), TraceErrorKind> {
    nonzero(ev, field, value)?;
    at_most(ev, field, value.into(), MAX_TP_SIZE.into())
}

/// The local worker's sizes divide (block sizes, TP): none may be 0.
fn check_worker(w: &WorkerArgs) -> Result<(), TraceErrorKind> {
    const EV: &str = "make_worker";
    nonzero(EV, "local_block_size", w.local_block_size)?;
    nonzero(EV, "kernel_block_size", w.kernel_block_size)?;
    tp_size(EV, "tp_size", w.tp_size)
}

/// A remote rank's block size, blocks per logical block and TP size divide;
/// its logical block and block count must fit in 32 bits.
fn check_remote(a: &AddRemoteAgent) -> Result<(), TraceErrorKind> {
    const EV: &str = "add_remote_agent";
    tp_size(EV, "remote_tp_size", a.args.remote_tp_size)?;
    let m = &a.remote_meta;
    nonzero(EV, "block_size", m.block_size)?;
    let ppl = m.physical_blocks_per_logical_kv_block;
    nonzero(EV, "physical_blocks_per_logical_kv_block", ppl)?;
    at_most(
        EV,
        "physical_blocks_per_logical_kv_block",
        ppl.into(),
        u64::from(u32::MAX / m.block_size),
    )?;
    at_most(
        EV,
        "num_blocks",
        m.num_blocks,
        u64::from(u32::MAX) * u64::from(ppl),
    )
}

/// The request's TP size divides; its block ids and counts fill 32-bit fields.
fn check_request(r: &RequestEvent) -> Result<(), TraceErrorKind> {
    const EV: &str = "request";
    let b = &r.blocks;
    tp_size(EV, "tp_size", b.tp_size)?;
    let ids = |field, groups: &[Vec<u64>]| {
        groups
            .iter()
            .flatten()
            .try_for_each(|&id| at_most(EV, field, id, u32::MAX.into()))
    };
    ids("local_block_ids", &b.local_block_ids)?;
    ids("local_physical_block_ids", &b.local_physical_block_ids)?;
    ids("remote_block_ids", &b.remote_block_ids)?;
    b.local_num_computed_blocks
        .iter()
        .try_for_each(|&n| at_most(EV, "local_num_computed_blocks", n, u32::MAX.into()))
}

/// The request's block ids lie inside the local pool and every remote
/// rank's pool (`num_blocks / physical_blocks_per_logical_kv_block`).
fn in_pools(
    r: &RequestEvent,
    w: &WorkerArgs,
    remotes: &[RemoteRank],
) -> Result<(), TraceErrorKind> {
    let inside = |field, groups: &[Vec<u64>], blocks: u64| match groups
        .iter()
        .flatten()
        .find(|&&id| id >= blocks)
    {
        Some(&id) => Err(TraceErrorKind::BlockOutOfPool { field, id, blocks }),
        None => Ok(()),
    };
    inside(
        "local_block_ids",
        &r.blocks.local_block_ids,
        w.num_logical_blocks.into(),
    )?;
    for remote in remotes {
        let m = &remote.meta;
        let blocks = m.num_blocks / u64::from(m.physical_blocks_per_logical_kv_block.max(1));
        inside("remote_block_ids", &r.blocks.remote_block_ids, blocks)?;
    }
    Ok(())
}

/// File name without `.jsonl` / `.jsonl.gz`.
fn case_name(path: &Path) -> String {
    let file = path
        .file_name()
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    let file = file.strip_suffix(".gz").unwrap_or(&file);
    file.strip_suffix(".jsonl").unwrap_or(file).to_string()
}

/// Tie each remote list to its rank (by `dst_handle`, else by agent name).
fn link_remotes(
    path: &Path,
    dlists: &mut [ExpectedDlist],
    by_handle: &HashMap<DlistHandle, usize>,
    events: Vec<(usize, AddRemoteAgent)>,
) -> Result<Vec<RemoteRank>, TraceError> {
    let remotes: Vec<RemoteRank> = events
        .into_iter()
        .map(|(line, a)| RemoteRank {
            line,
            tp_rank: a.args.remote_tp_rank,
            tp_size: a.args.remote_tp_size,
            dcp_size: a.args.remote_dcp_size,
            agent_name: a.result.unwrap_or_default(),
            dlist: a.dst_handle.and_then(|h| by_handle.get(&h).copied()),
            meta: a.remote_meta,
            dst_num_blocks: a.dst_num_blocks,
            dst_region_num_blocks: a.dst_region_num_blocks,
            refused: a.exception.map(|e| match e {
                serde_json::Value::String(text) => text,
                other => other.to_string(),
            }),
        })
        .collect();
    for (index, list) in dlists.iter_mut().enumerate() {
        let DlistTarget::Remote(name) = &list.target else {
            continue;
        };
        let remote = remotes
            .iter()
            .position(|r| r.dlist == Some(index))
            .or_else(|| remotes.iter().position(|r| &r.agent_name == name))
            .ok_or_else(|| {
                TraceError::new(
                    path,
                    Some(list.line),
                    TraceErrorKind::UnknownRemote {
                        handle: list.handle.0,
                        target: name.clone(),
                    },
                )
            })?;
        list.role = ListRole::Remote {
            remote,
            tp_rank: remotes[remote].tp_rank,
        };
    }
    Ok(remotes)
}

/// The refusal of a trace whose handshake vLLM refused before any read.
fn handshake_refused(why: &str) -> TraceErrorKind {
    TraceErrorKind::NotModelled(Box::new(super::error::Refusal {
        ev: "add_remote_agent",
        field: "exception".to_string(),
        value: serde_json::Value::from(why).to_string(),
        why: "vLLM refused the handshake, so the trace holds no request; a v1 trace does not \
              carry all the handshake checked (decode's prefix caching among it), so kvgeom \
              cannot tell whether its connector refuses it too"
            .to_string(),
        instead: "record a v2 trace of the geometry instead (`kvgeom sweep --connector vllm \
                  GEOMETRY --record-traces DIR`), whose judge compares the rejection"
            .to_string(),
    }))
}
