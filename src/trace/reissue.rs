//! Re-issuing a trace's own calls: register the trace's regions, prepare
//! its lists and make its transfers through a `Recording<DryRun>`, with the
//! memory optionally moved to other base addresses. The recording then holds
//! what a perfectly faithful connector would have produced, which is what
//! the diff engine's own tests and `check-trace` style sanity runs need.

use std::collections::{BTreeMap, HashMap};

use super::case::{ListRole, TraceCase};
use super::diff::ActualRun;
use super::normalize::{Location, RegionMap};
use crate::nixl::{
    DescList, DlistHandle, DlistTarget, DryRun, MemRegion, Nixl, NixlError, Recording, StridedRun,
};

/// Where the re-issued run puts each region.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Relocation {
    /// New base of each local region, in region-index order.
    pub local_bases: Vec<u64>,
    /// New bases of each remote agent's regions, by agent name.
    pub remote_bases: BTreeMap<String, Vec<u64>>,
}

impl Relocation {
    /// The trace's own addresses.
    pub fn as_recorded(case: &TraceCase) -> Self {
        Self::shifted(case, 0, 0)
    }

    /// Every local base moved up by `local_shift` bytes, every remote base by
    /// `remote_shift`.
    pub fn shifted(case: &TraceCase, local_shift: u64, remote_shift: u64) -> Self {
        let mut remote_bases = BTreeMap::new();
        for r in &case.remotes {
            remote_bases.entry(r.agent_name.clone()).or_insert_with(|| {
                r.meta
                    .kv_caches_base_addr
                    .iter()
                    .map(|b| b.wrapping_add(remote_shift))
                    .collect()
            });
        }
        Self {
            local_bases: case
                .local_regions
                .iter()
                .map(|r| r.addr.wrapping_add(local_shift))
                .collect(),
            remote_bases,
        }
    }
}

/// Why a trace could not be re-issued.
#[derive(Debug, thiserror::Error)]
pub enum ReissueError {
    /// The dry-run transport refused a call.
    #[error(transparent)]
    Nixl(#[from] NixlError),
    /// A strided run that spans regions, so no single base moves it.
    #[error(
        "dlist #{list} strided run {run} does not lie inside one region, so it cannot be moved"
    )]
    Unrelocatable {
        /// The list's index in preparation order.
        list: usize,
        /// The run's index in the list.
        run: usize,
    },
    /// A transfer naming a handle the trace never prepared (the handle).
    #[error("a transfer refers to dlist handle {0}, which the trace never prepared")]
    UnknownHandle(u64),
    /// No relocated bases for a remote agent (its name).
    #[error("no relocated bases for remote agent `{0}`")]
    MissingBases(String),
    /// Relocated bases that do not match the trace's regions in number.
    #[error("{what}: {expected} regions in the trace but {found} relocated bases")]
    RegionCount {
        /// The agent (local worker or remote) whose bases these are.
        what: String,
        /// Regions in the trace.
        expected: usize,
        /// Relocated bases given.
        found: usize,
    },
}

/// Re-issue `case`'s registration, lists and transfers on a new agent named
/// `agent_name` of `nixl`. Remote agents are loaded with their names as
/// metadata (what [`DryRun`] expects). Returns what [`super::diff::diff_run`]
/// needs to compare the recording with the case.
pub fn reissue(
    case: &TraceCase,
    nixl: &mut Recording<DryRun>,
    agent_name: &str,
    relocation: &Relocation,
) -> Result<ActualRun, ReissueError> {
    let agent = nixl.create_agent(agent_name)?;
    let geometry = &case.local_geometry;
    if relocation.local_bases.len() != case.local_regions.len() {
        return Err(ReissueError::RegionCount {
            what: "local".into(),
            expected: case.local_regions.len(),
            found: relocation.local_bases.len(),
        });
    }
    let regions: Vec<MemRegion> = case
        .local_regions
        .iter()
        .zip(&relocation.local_bases)
        .enumerate()
        .map(|(i, (r, &base))| MemRegion {
            addr: base,
            len: r.len,
            mem: geometry
                .region_mem_types
                .get(i)
                .copied()
                .unwrap_or(geometry.nixl_memory_type),
            dev: r.dev,
        })
        .collect();
    nixl.register_memory(agent, &regions)?;
    for remote in &case.remotes {
        nixl.add_remote_agent(agent, remote.agent_name.as_bytes())?;
    }

    let local_new = RegionMap::from_bases(&relocation.local_bases, &case.local_region_lens());
    let mut handles: HashMap<DlistHandle, DlistHandle> = HashMap::new();
    for (index, expected) in case.dlists.iter().enumerate() {
        let old = case.region_map_of(index);
        let new = match (&expected.role, &expected.target) {
            (ListRole::Remote { .. }, DlistTarget::Remote(name)) => {
                let bases = relocation
                    .remote_bases
                    .get(name)
                    .ok_or_else(|| ReissueError::MissingBases(name.clone()))?;
                if bases.len() != old.len() {
                    return Err(ReissueError::RegionCount {
                        what: format!("remote agent `{name}`"),
                        expected: old.len(),
                        found: bases.len(),
                    });
                }
                let lens: Vec<u64> = old.regions().iter().map(|r| r.len).collect();
                RegionMap::from_bases(bases, &lens)
            }
            _ => local_new.clone(),
        };
        let list = relocate(&expected.list, &old, &new, index)?;
        let handle = nixl.prepare_dlist(agent, &expected.target, expected.mem, &list)?;
        handles.insert(expected.handle, handle);
    }

    for x in &case.xfers {
        let find = |h: DlistHandle| {
            handles
                .get(&h)
                .copied()
                .ok_or(ReissueError::UnknownHandle(h.0))
        };
        let (local, remote) = (find(x.local_handle)?, find(x.remote_handle)?);
        let xfer = nixl.make_xfer(
            agent,
            x.op,
            local,
            &x.local_ids,
            remote,
            &x.remote_ids,
            x.notif_msg.as_deref().map(str::as_bytes),
        )?;
        nixl.post_xfer(agent, xfer)?;
    }

    Ok(ActualRun {
        agent,
        local_bases: relocation.local_bases.clone(),
        remote_bases: relocation.remote_bases.clone(),
    })
}

/// Move every run from `old` region bases to `new` ones.
fn relocate(
    list: &DescList,
    old: &RegionMap,
    new: &RegionMap,
    index: usize,
) -> Result<DescList, ReissueError> {
    let mut out = DescList::new();
    for (run_index, run) in list.runs().iter().enumerate() {
        let unmovable = ReissueError::Unrelocatable {
            list: index,
            run: run_index,
        };
        let first = old.locate(run.addr);
        let last = old.locate(run.row(run.count - 1).addr);
        let (
            Location::InRegion { region, .. },
            Location::InRegion {
                region: last_region,
                ..
            },
        ) = (first, last)
        else {
            return Err(unmovable);
        };
        if region != last_region {
            return Err(unmovable);
        }
        let addr = new.address(first).ok_or(unmovable)?;
        out.push_run(StridedRun { addr, ..*run });
    }
    Ok(out)
}
