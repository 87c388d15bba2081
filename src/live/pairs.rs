//! A driver's report of the connector it ran (vLLM's live driver, or a
//! recorded v2 trace of it) as a run record: its addresses moved onto
//! kvgeom's arenas, its transfers resolved into pairs on kvgeom's layout
//! model of the case.

use std::collections::HashMap;

use super::protocol::{CaseResult, DlistRecord};
use super::run::{side_index, Prepared};
use crate::layout::Side;
use crate::nixl::recording::ResolvedPair;
use crate::nixl::{AgentId, DescRow, XferOp};

/// Why vLLM's recorded transfers cannot be resolved to pairs.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ResolveError {
    #[error("transfer {xfer}: unknown operation {op}")]
    UnknownOperation { xfer: usize, op: String },
    #[error("transfer {xfer}: unknown {which} list {handle}")]
    UnknownList {
        xfer: usize,
        /// `local` or `remote`.
        which: &'static str,
        handle: u64,
    },
}

/// vLLM's addresses moved onto kvgeom's arenas: same region, same offset.
pub(crate) fn relocate(result: &CaseResult, p: &Prepared, agent: &str, row: DescRow) -> DescRow {
    let Some((side, rank)) = Side::parse_agent_name(agent) else {
        return row;
    };
    let kvgeom = &p.bases[side_index(side)];
    if let (Some(vllm), Some(ours)) = (result.regions.get(agent), kvgeom.get(rank as usize)) {
        for (i, &(base, len)) in vllm.iter().enumerate() {
            if row.addr >= base && row.addr < base + len {
                if let Some(&to) = ours.get(i) {
                    return DescRow {
                        addr: to + (row.addr - base),
                        ..row
                    };
                }
            }
        }
    }
    row
}

pub(crate) fn resolve_pairs(
    result: &CaseResult,
    p: &Prepared,
) -> Result<Vec<ResolvedPair<crate::layout::Location>>, ResolveError> {
    let lists: HashMap<(&str, u64), &DlistRecord> = result
        .dlists
        .iter()
        .map(|d| ((d.agent.as_str(), d.handle), d))
        .collect();
    let mut out = Vec::new();
    for (xi, x) in result.xfers.iter().enumerate() {
        let op = match x.op.as_str() {
            "READ" => XferOp::Read,
            "WRITE" => XferOp::Write,
            other => {
                return Err(ResolveError::UnknownOperation {
                    xfer: xi,
                    op: other.to_string(),
                })
            }
        };
        let list = |which: &'static str, handle: u64| {
            lists
                .get(&(x.agent.as_str(), handle))
                .ok_or(ResolveError::UnknownList {
                    xfer: xi,
                    which,
                    handle,
                })
        };
        let local = list("local", x.local)?;
        let remote = list("remote", x.remote)?;
        let remote_agent = remote.target.clone();
        for (pi, (&l, &r)) in x.local_ids.iter().zip(&x.remote_ids).enumerate() {
            let (Some(&lr), Some(&rr)) = (local.rows.get(l as usize), remote.rows.get(r as usize))
            else {
                continue;
            };
            let lrow = relocate(
                result,
                p,
                &x.agent,
                DescRow {
                    addr: lr.0,
                    len: lr.1,
                    dev: lr.2,
                },
            );
            let rrow = relocate(
                result,
                p,
                &remote_agent,
                DescRow {
                    addr: rr.0,
                    len: rr.1,
                    dev: rr.2,
                },
            );
            out.push(ResolvedPair {
                xfer: xi,
                pair: pi,
                op,
                initiator: AgentId(0),
                remote_agent: remote_agent.clone(),
                local: lrow,
                remote: rrow,
                local_location: p.layout.classify_named(&x.agent, lrow),
                remote_location: p.layout.classify_named(&remote_agent, rrow),
                posted: x.posted,
            });
        }
    }
    Ok(out)
}
