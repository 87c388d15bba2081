//! [`ConnectorLog`]: what a connector under test did in one case, in one
//! connector-neutral form: the regions each rank registered, every
//! descriptor list (role, memory type, rows), every transfer, the receive
//! post-process calls and every handshake. kvgeom's connector writes it
//! from its recording transport; each driver's connector converts its own
//! report into it (vLLM's in `live`, a recorded trace's in `trace`). The trace writer serialises it; `explain` and the
//! tests read it the same way for every connector.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::connector::post_process::{asks_for_conversion, zeroed_ranges};
use crate::layout::Side;
use crate::nixl::recording::Event;
use crate::nixl::{AgentId, DlistTarget, MemKind, XferHandle, XferOp};
use crate::scenario::{CaseRun, HandshakeRecord};

/// What a connector did in one case, connector-neutral.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ConnectorLog {
    /// Each agent's registered regions, `(address, bytes)`, in
    /// registration order.
    pub regions: BTreeMap<String, Vec<(u64, u64)>>,
    /// Every descriptor list prepared, rows expanded.
    pub dlists: Vec<DlistRecord>,
    /// Every transfer made, in order (`posted` when it was posted).
    pub xfers: Vec<XferRecord>,
    /// Every call of a decode rank's receive post-process.
    pub post_process_calls: Vec<PostProcessCall>,
    /// Every region-mapped zeroing call (vLLM's, when P's and D's cache
    /// group layouts differ).
    pub region_zero_calls: Vec<RegionZeroCall>,
    /// Every handshake a rank attempted with a peer rank.
    pub handshakes: Vec<HandshakeRecord>,
}

/// A prepared descriptor list, rows expanded to `(addr, len, dev)`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
pub struct DlistRecord {
    /// The agent that prepared the list.
    pub agent: String,
    /// The list's handle, as the transfers name it.
    pub handle: u64,
    /// `local`, or the remote agent's name.
    pub target: String,
    /// The NIXL memory type the list was prepared with (`DRAM` or `VRAM`).
    pub mem: String,
    /// One `(address, length in bytes, device)` per descriptor.
    pub rows: Vec<(u64, u64, u32)>,
}

/// One transfer the connector made.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
pub struct XferRecord {
    /// The agent that posted the transfer.
    pub agent: String,
    /// `READ` or `WRITE`.
    pub op: String,
    /// Handle of the local list.
    pub local: u64,
    /// Desc ids into the local list; position k pairs with `remote_ids[k]`.
    pub local_ids: Vec<u32>,
    /// Handle of the remote list.
    pub remote: u64,
    /// Desc ids into the remote list.
    pub remote_ids: Vec<u32>,
    /// Whether the transfer was posted (not only created).
    pub posted: bool,
}

/// One call of the receive post-process on a decode rank (vLLM's
/// `post_process_device_kv_on_receive`).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PostProcessCall {
    /// The decode agent.
    pub agent: String,
    /// Local kernel block / remote kernel block.
    pub block_size_ratio: u32,
    /// Per request and attention group: `(group, local kernel block ids,
    /// remote-sized sub-blocks the transfer covered)`; the covered
    /// sub-blocks are a count or, from vLLM 0.34.0, a range
    /// ([`CoveredRange`](super::covered_range::CoveredRange)).
    pub block_ids_list: Vec<(u32, Vec<u32>, super::covered_range::CoveredRange)>,
    /// Whether the call asked for the block-size or layout conversion.
    pub convert: bool,
    /// The byte ranges the call set to zero, `(addr, len)` in the agent's
    /// regions; `None` when not measured (regions above the driver's limit,
    /// or a call that raised; absent from older drivers).
    #[serde(default)]
    pub zeroed: Option<Vec<(u64, u64)>>,
}

/// One region-mapped zeroing call on a decode rank (vLLM's
/// `_zero_region_blocks`).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RegionZeroCall {
    /// The decode agent.
    pub agent: String,
    /// Per region, the kernel blocks cleared.
    pub region_block_ids: Vec<Vec<u32>>,
    /// The byte ranges the call set to zero, as in [`PostProcessCall`].
    #[serde(default)]
    pub zeroed: Option<Vec<(u64, u64)>>,
}

impl ConnectorLog {
    /// kvgeom's run: each agent's regions and every list and transfer the
    /// recording transport logged, its handshakes, and one receive
    /// post-process call per decode rank that planned any group.
    pub fn of_kvgeom(run: &CaseRun) -> Self {
        let mut log = ConnectorLog {
            handshakes: run.handshakes.clone(),
            ..ConnectorLog::default()
        };
        let Some(recording) = &run.recording else {
            return log;
        };
        let name = |agent| recording.name_of(agent).unwrap_or("?").to_string();
        for event in recording.events() {
            if let Event::RegisterMemory { agent, regions } = event {
                let entry = log.regions.entry(name(*agent)).or_default();
                entry.extend(regions.iter().map(|r| (r.addr, r.len)));
            } else if let Some(d) = event.dlist() {
                log.dlists.push(DlistRecord {
                    agent: name(d.agent),
                    handle: d.handle.0,
                    target: match d.target {
                        DlistTarget::Local => "local".to_string(),
                        DlistTarget::Remote(peer) => peer.clone(),
                    },
                    mem: mem_name(d.mem).to_string(),
                    rows: d.list.rows().map(|r| (r.addr, r.len, r.dev)).collect(),
                });
            }
        }
        for x in recording.xfers() {
            log.xfers.push(XferRecord {
                agent: name(x.agent),
                op: match x.op {
                    XferOp::Read => "READ",
                    XferOp::Write => "WRITE",
                }
                .to_string(),
                local: list_of(recording.events(), x.agent, x.handle, true),
                local_ids: x.local_ids.to_vec(),
                remote: list_of(recording.events(), x.agent, x.handle, false),
                remote_ids: x.remote_ids.to_vec(),
                posted: x.posted,
            });
        }
        let is_mla = run.report.case.geometry.model.is_mla();
        for (rank, plans) in run.post_process.iter().filter(|(_, p)| !p.is_empty()) {
            let agent = Side::Decode.agent_name(*rank);
            let geometries = run
                .decode_page_geometries
                .get(*rank as usize)
                .map(Vec::as_slice)
                .unwrap_or(&[]);
            let bases = log.regions.get(&agent).cloned().unwrap_or_default();
            let zeroed = zeroed_ranges(plans, geometries)
                .into_iter()
                .filter_map(|(region, offset, len)| Some((bases.get(region)?.0 + offset, len)))
                .collect();
            let ratio = plans[0].ratio;
            log.post_process_calls.push(PostProcessCall {
                agent,
                block_size_ratio: ratio,
                block_ids_list: plans
                    .iter()
                    .map(|p| {
                        (
                            p.group as u32,
                            p.block_ids.clone(),
                            super::CoveredRange {
                                start: p.first_covered_sub_block,
                                stop: p.covered_sub_blocks,
                            },
                        )
                    })
                    .collect(),
                convert: asks_for_conversion(is_mla, ratio),
                zeroed: Some(zeroed),
            });
        }
        log
    }
}

fn mem_name(mem: MemKind) -> &'static str {
    match mem {
        MemKind::Dram => "DRAM",
        MemKind::Vram => "VRAM",
    }
}

/// The local (or remote) list handle of transfer `handle` of `agent`.
fn list_of(events: &[Event], agent: AgentId, handle: XferHandle, local_list: bool) -> u64 {
    events
        .iter()
        .filter_map(Event::xfer)
        .find(|(a, h, _)| *a == agent && *h == handle)
        .map(|(.., x)| if local_list { x.local.0 } else { x.remote.0 })
        .unwrap_or_default()
}
