//! The lists of a v2 trace and of kvgeom's rebuild of its case, compared
//! independent of addresses and handles: per agent, each list's target,
//! memory type and rows as (agent, region, offset, length).

use super::recorded::RecordedCase;
use crate::live::pairs::relocate;
use crate::nixl::recording::Event;
use crate::nixl::{DescRow, DlistTarget, MemKind};
use crate::under_test::judge::place_of;

/// One prepared list, independent of addresses and handles: whose memory
/// it addresses, its memory type and each row as `agent rREGION+OFFSET/LEN`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct ListKey {
    agent: String,
    target: String,
    mem: String,
    rows: Vec<String>,
}

impl std::fmt::Display for ListKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}'s {} list to {} ({} rows",
            self.agent,
            self.mem,
            self.target,
            self.rows.len()
        )?;
        match self.rows.first() {
            Some(first) => write!(f, ", first {first})"),
            None => f.write_str(")"),
        }
    }
}

/// A memory type as the driver's lists spell it.
fn mem_name(mem: MemKind) -> &'static str {
    match mem {
        MemKind::Dram => "DRAM",
        MemKind::Vram => "VRAM",
    }
}

/// vLLM's lists in the trace, sorted. A remote list no transfer reads is
/// left out (here and in kvgeom's run): the driver loads every prefill rank
/// on every decode rank, where vLLM's own handshake loads only the ranks it
/// reads.
pub(crate) fn traced_lists(rc: &RecordedCase) -> Vec<ListKey> {
    let p = rc.prepared();
    let read: std::collections::HashSet<(&str, &str)> = rc
        .result
        .xfers
        .iter()
        .filter_map(|x| {
            let remote = rc
                .result
                .dlists
                .iter()
                .find(|d| d.agent == x.agent && d.handle == x.remote)?;
            Some((x.agent.as_str(), remote.target.as_str()))
        })
        .collect();
    let mut out: Vec<ListKey> = rc
        .result
        .dlists
        .iter()
        .filter(|d| d.target == "local" || read.contains(&(d.agent.as_str(), d.target.as_str())))
        .map(|d| {
            let owner = if d.target == "local" {
                d.agent.as_str()
            } else {
                d.target.as_str()
            };
            ListKey {
                agent: d.agent.clone(),
                target: d.target.clone(),
                mem: d.mem.clone(),
                rows: d
                    .rows
                    .iter()
                    .map(|&(addr, len, dev)| {
                        let row = relocate(&rc.result, p, owner, DescRow { addr, len, dev });
                        place_of(&p.layout, row)
                    })
                    .collect(),
            }
        })
        .collect();
    out.sort();
    out
}

/// kvgeom's lists in its run (host tensors under a device platform, as
/// the driver runs vLLM: the memory types are those vLLM's rule gives),
/// sorted; remote lists no transfer reads are left out.
pub(crate) fn rebuilt_lists(run: &crate::scenario::CaseRun) -> Vec<ListKey> {
    let (Some(recording), Some(layout)) = (&run.recording, &run.layout) else {
        return Vec::new();
    };
    let read: std::collections::HashSet<_> = recording
        .events()
        .iter()
        .filter_map(|e| match e {
            Event::Xfer { agent, remote, .. } => Some((*agent, *remote)),
            _ => None,
        })
        .collect();
    let mut out = Vec::new();
    for d in recording.events().iter().filter_map(Event::dlist) {
        let target = match d.target {
            DlistTarget::Local => "local".to_string(),
            DlistTarget::Remote(_) if !read.contains(&(d.agent, d.handle)) => continue,
            DlistTarget::Remote(peer) => peer.clone(),
        };
        out.push(ListKey {
            agent: recording.name_of(d.agent).unwrap_or("?").to_string(),
            target,
            mem: mem_name(d.mem).to_string(),
            rows: d.list.rows().map(|row| place_of(layout, row)).collect(),
        });
    }
    out.sort();
    out
}

/// The first list one side prepared that the other did not.
pub(crate) fn first_list_difference(ours: &[ListKey], theirs: &[ListKey]) -> Option<String> {
    let only = |a: &[ListKey], b: &[ListKey]| a.iter().find(|k| !b.contains(k)).cloned();
    match (only(ours, theirs), only(theirs, ours)) {
        (None, None) if ours.len() == theirs.len() => None,
        (None, None) => Some(format!(
            "kvgeom prepares {} lists, vLLM {}",
            ours.len(),
            theirs.len()
        )),
        (Some(k), Some(v)) => Some(format!("list: kvgeom prepares {k}; vLLM {v}")),
        (Some(k), None) => Some(format!("list: kvgeom prepares {k}, which vLLM does not")),
        (None, Some(v)) => Some(format!("list: vLLM prepares {v}, which kvgeom does not")),
    }
}
