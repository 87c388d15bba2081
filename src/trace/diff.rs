//! The trace diff engine: compares a [`TraceCase`]'s expected descriptor
//! lists and transfers with what a run recorded through
//! [`crate::nixl::Recording`], on normalised rows, and reports the first
//! difference (or MATCH).
//!
//! Lists are matched by preparation order (the k-th list the agent
//! prepared), transfers by order. Rows are compared expanded, as desc ids
//! index them: (region, offset, length); devices are not compared. A
//! transfer's handles are compared through the index of the list they refer
//! to. [`diff_block_ids`] compares per-group block ids the same way (e.g.
//! `request_done`'s rewritten remote ids).

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use serde::Serialize;

use super::case::TraceCase;
use super::normalize::{NormRow, RegionMap};
use crate::nixl::recording::Event;
use crate::nixl::{AgentId, DlistHandle, DlistTarget, MemKind, RecordedDlist, XferOp, XferSpec};

/// Where the compared run put its memory. Region lengths are the trace's;
/// only the bases differ between runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ActualRun {
    /// The agent whose recorded lists and transfers are compared.
    pub agent: AgentId,
    /// Base address of each local region, in region-index order.
    pub local_bases: Vec<u64>,
    /// Base address of each region of each remote agent, by agent name.
    pub remote_bases: BTreeMap<String, Vec<u64>>,
}

/// Which side of a transfer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Side {
    /// The initiator's own list.
    Local,
    /// The peer's list.
    Remote,
}

impl fmt::Display for Side {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Side::Local => "local",
            Side::Remote => "remote",
        })
    }
}

/// The first difference found. `list` and `xfer` are 0-based positions;
/// `label` is how the trace names the list (`"split, target NIXL_INIT_AGENT"`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum Difference {
    /// The run registered a different number of local regions.
    LocalRegionCount {
        /// What the trace has.
        expected: usize,
        /// What the run recorded.
        found: usize,
    },
    /// A remote list's agent has no bases in the run.
    RemoteBasesMissing {
        /// The list's position in preparation order.
        list: usize,
        /// How the trace names the list.
        label: String,
        /// The remote agent's name.
        agent: String,
    },
    /// A remote agent has a different number of regions in the run.
    RemoteRegionCount {
        /// The list's position in preparation order.
        list: usize,
        /// How the trace names the list.
        label: String,
        /// The remote agent's name.
        agent: String,
        /// What the trace has.
        expected: usize,
        /// What the run recorded.
        found: usize,
    },
    /// The run prepared a different number of lists.
    DlistCount {
        /// What the trace has.
        expected: usize,
        /// What the run recorded.
        found: usize,
    },
    /// A list prepared against another agent.
    DlistTarget {
        /// The list's position in preparation order.
        list: usize,
        /// How the trace names the list.
        label: String,
        /// What the run recorded.
        found: String,
    },
    /// A list prepared with another memory type.
    DlistMem {
        /// The list's position in preparation order.
        list: usize,
        /// How the trace names the list.
        label: String,
        /// What the trace has.
        expected: MemKind,
        /// What the run recorded.
        found: MemKind,
    },
    /// A row of a list differs (region, offset or length).
    DlistRow {
        /// The list's position in preparation order.
        list: usize,
        /// How the trace names the list.
        label: String,
        /// The row's desc id.
        row: usize,
        /// What the trace has.
        expected: NormRow,
        /// What the run recorded.
        found: NormRow,
    },
    /// A list has a different number of rows.
    DlistRowCount {
        /// The list's position in preparation order.
        list: usize,
        /// How the trace names the list.
        label: String,
        /// What the trace has.
        expected: usize,
        /// What the run recorded.
        found: usize,
    },
    /// The run made a different number of transfers.
    XferCount {
        /// What the trace has.
        expected: usize,
        /// What the run recorded.
        found: usize,
    },
    /// A transfer in the other direction.
    XferOp {
        /// The transfer's position, in order.
        xfer: usize,
        /// What the trace has.
        expected: XferOp,
        /// What the run recorded.
        found: XferOp,
    },
    /// A transfer's handle refers to another list (`found: None`: to no
    /// list the agent prepared).
    XferList {
        /// The transfer's position, in order.
        xfer: usize,
        /// Which of the transfer's lists.
        side: Side,
        /// What the trace has.
        expected: usize,
        /// What the run recorded.
        found: Option<usize>,
    },
    /// A desc id of a transfer differs.
    XferId {
        /// The transfer's position, in order.
        xfer: usize,
        /// The pair's index in the transfer.
        pair: usize,
        /// Which of the transfer's lists.
        side: Side,
        /// What the trace has.
        expected: u32,
        /// What the run recorded.
        found: u32,
    },
    /// A transfer has a different number of ids on one side.
    XferPairCount {
        /// The transfer's position, in order.
        xfer: usize,
        /// Which of the transfer's lists.
        side: Side,
        /// What the trace has.
        expected: usize,
        /// What the run recorded.
        found: usize,
    },
    /// A transfer carries another notification.
    XferNotif {
        /// The transfer's position, in order.
        xfer: usize,
        /// What the trace has.
        expected: Option<String>,
        /// What the run recorded.
        found: Option<String>,
    },
    /// Block ids for a different number of KV-cache groups.
    GroupCount {
        /// Which block ids (e.g. `request_done`'s remote ids).
        what: String,
        /// What the trace has.
        expected: usize,
        /// What the run recorded.
        found: usize,
    },
    /// A block id differs.
    BlockId {
        /// Which block ids (e.g. `request_done`'s remote ids).
        what: String,
        /// The KV-cache group.
        group: usize,
        /// Position in the group's list.
        index: usize,
        /// What the trace has.
        expected: u64,
        /// What the run recorded.
        found: u64,
    },
    /// A group has a different number of block ids.
    BlockCount {
        /// Which block ids (e.g. `request_done`'s remote ids).
        what: String,
        /// The KV-cache group.
        group: usize,
        /// What the trace has.
        expected: usize,
        /// What the run recorded.
        found: usize,
    },
    /// One side refused the read and the other did not.
    ReadOutcome {
        /// The exception vLLM's read raised, if it did (`request_done`).
        vllm: Option<String>,
        /// Why kvgeom's connector refused the read, if it did.
        kvgeom: Option<String>,
    },
}

fn opt(s: &Option<String>) -> String {
    s.as_ref()
        .map_or_else(|| "none".to_string(), |s| format!("{s:?}"))
}

fn list_name(list: Option<usize>) -> String {
    list.map_or_else(|| "no prepared list".to_string(), |l| format!("dlist #{l}"))
}

impl fmt::Display for Difference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use Difference as D;
        match self {
            D::ReadOutcome { vllm, kvgeom } => write!(
                f,
                "the read: vLLM raised {}, kvgeom's connector refused it {}",
                opt(vllm),
                opt(kvgeom)
            ),
            D::LocalRegionCount { expected, found } => {
                write!(f, "local regions: expected {expected} found {found}")
            }
            D::RemoteBasesMissing { list, label, agent } => write!(
                f,
                "dlist #{list} ({label}): no bases given for remote agent `{agent}`"
            ),
            D::RemoteRegionCount {
                list,
                label,
                agent,
                expected,
                found,
            } => write!(
                f,
                "dlist #{list} ({label}): remote agent `{agent}` regions: expected {expected} found {found}"
            ),
            D::DlistCount { expected, found } => {
                write!(f, "dlist count: expected {expected} found {found}")
            }
            D::DlistTarget { list, label, found } => {
                write!(f, "dlist #{list} ({label}): found target {found}")
            }
            D::DlistMem {
                list,
                label,
                expected,
                found,
            } => write!(
                f,
                "dlist #{list} ({label}): mem type expected {expected:?} found {found:?}"
            ),
            D::DlistRow {
                list,
                label,
                row,
                expected,
                found,
            } => write!(
                f,
                "dlist #{list} ({label}) row {row}: expected {expected} found {found}"
            ),
            D::DlistRowCount {
                list,
                label,
                expected,
                found,
            } => write!(
                f,
                "dlist #{list} ({label}): expected {expected} rows found {found}"
            ),
            D::XferCount { expected, found } => {
                write!(f, "xfer count: expected {expected} found {found}")
            }
            D::XferOp {
                xfer,
                expected,
                found,
            } => write!(
                f,
                "xfer #{xfer}: op expected {} found {}",
                expected.as_str(),
                found.as_str()
            ),
            D::XferList {
                xfer,
                side,
                expected,
                found,
            } => write!(
                f,
                "xfer #{xfer}: {side} handle expected dlist #{expected} found {}",
                list_name(*found)
            ),
            D::XferId {
                xfer,
                pair,
                side,
                expected,
                found,
            } => write!(
                f,
                "xfer #{xfer} pair {pair}: {side} id expected {expected} found {found}"
            ),
            D::XferPairCount {
                xfer,
                side,
                expected,
                found,
            } => write!(
                f,
                "xfer #{xfer}: {side} ids: expected {expected} found {found}"
            ),
            D::XferNotif {
                xfer,
                expected,
                found,
            } => write!(
                f,
                "xfer #{xfer}: notif_msg expected {} found {}",
                opt(expected),
                opt(found)
            ),
            D::GroupCount {
                what,
                expected,
                found,
            } => write!(f, "{what}: expected {expected} groups found {found}"),
            D::BlockId {
                what,
                group,
                index,
                expected,
                found,
            } => write!(
                f,
                "{what} group {group} [{index}]: expected {expected} found {found}"
            ),
            D::BlockCount {
                what,
                group,
                expected,
                found,
            } => write!(
                f,
                "{what} group {group}: expected {expected} ids found {found}"
            ),
        }
    }
}

/// The outcome of a comparison.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum DiffReport {
    /// Every list and transfer agrees.
    Match,
    /// The first difference.
    Differ(Difference),
}

impl DiffReport {
    /// Whether everything agrees.
    pub fn is_match(&self) -> bool {
        matches!(self, DiffReport::Match)
    }

    /// The first difference, if any.
    pub fn difference(&self) -> Option<&Difference> {
        match self {
            DiffReport::Match => None,
            DiffReport::Differ(d) => Some(d),
        }
    }
}

impl fmt::Display for DiffReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DiffReport::Match => f.write_str("MATCH"),
            DiffReport::Differ(d) => d.fmt(f),
        }
    }
}

impl From<Result<(), Difference>> for DiffReport {
    fn from(r: Result<(), Difference>) -> Self {
        r.map_or_else(DiffReport::Differ, |()| DiffReport::Match)
    }
}

/// Compare `case`'s expected lists and transfers with `events` (a
/// recording's [`crate::nixl::Recording::events`]) of agent `actual.agent`.
pub fn diff_run(case: &TraceCase, events: &[Event], actual: &ActualRun) -> DiffReport {
    compare_run(case, events, actual).into()
}

fn compare_run(case: &TraceCase, events: &[Event], actual: &ActualRun) -> Result<(), Difference> {
    let lists: Vec<RecordedDlist<'_>> = events
        .iter()
        .filter_map(Event::dlist)
        .filter(|l| l.agent == actual.agent)
        .collect();
    let xfers: Vec<XferSpec<'_>> = events
        .iter()
        .filter_map(Event::xfer)
        .filter(|(agent, ..)| *agent == actual.agent)
        .map(|(.., x)| x)
        .collect();

    let lens = case.local_region_lens();
    if actual.local_bases.len() != lens.len() {
        return Err(Difference::LocalRegionCount {
            expected: lens.len(),
            found: actual.local_bases.len(),
        });
    }
    let local_map = RegionMap::from_bases(&actual.local_bases, &lens);
    for index in 0..case.dlists.len().max(lists.len()) {
        match (case.dlists.get(index), lists.get(index)) {
            (Some(_), Some(found)) => compare_list(case, index, found, &local_map, actual)?,
            _ => {
                return Err(Difference::DlistCount {
                    expected: case.dlists.len(),
                    found: lists.len(),
                })
            }
        }
    }

    let positions: HashMap<DlistHandle, usize> = lists
        .iter()
        .enumerate()
        .map(|(i, l)| (l.handle, i))
        .collect();
    for index in 0..case.xfers.len().max(xfers.len()) {
        let (Some(expected), Some(found)) = (case.xfers.get(index), xfers.get(index)) else {
            return Err(Difference::XferCount {
                expected: case.xfers.len(),
                found: xfers.len(),
            });
        };
        if expected.op != found.op {
            return Err(Difference::XferOp {
                xfer: index,
                expected: expected.op,
                found: found.op,
            });
        }
        for (side, want, got) in [
            (Side::Local, expected.local_list, found.local),
            (Side::Remote, expected.remote_list, found.remote),
        ] {
            let got = positions.get(&got).copied();
            if got != Some(want) {
                return Err(Difference::XferList {
                    xfer: index,
                    side,
                    expected: want,
                    found: got,
                });
            }
        }
        compare_ids(index, Side::Local, &expected.local_ids, found.local_ids)?;
        compare_ids(index, Side::Remote, &expected.remote_ids, found.remote_ids)?;
        let found_msg = found
            .notification
            .map(|m| String::from_utf8_lossy(m).into_owned());
        if expected.notif_msg != found_msg {
            return Err(Difference::XferNotif {
                xfer: index,
                expected: expected.notif_msg.clone(),
                found: found_msg,
            });
        }
    }
    Ok(())
}

fn compare_list(
    case: &TraceCase,
    index: usize,
    found: &RecordedDlist<'_>,
    local_map: &RegionMap,
    actual: &ActualRun,
) -> Result<(), Difference> {
    let expected = &case.dlists[index];
    let label = case.list_label(index);
    let map = match (&expected.target, found.target) {
        (DlistTarget::Local, DlistTarget::Local) => local_map.clone(),
        (DlistTarget::Remote(_), DlistTarget::Remote(agent)) => {
            let Some(bases) = actual.remote_bases.get(agent) else {
                return Err(Difference::RemoteBasesMissing {
                    list: index,
                    label,
                    agent: agent.clone(),
                });
            };
            let lens: Vec<u64> = case
                .region_map_of(index)
                .regions()
                .iter()
                .map(|r| r.len)
                .collect();
            if bases.len() != lens.len() {
                return Err(Difference::RemoteRegionCount {
                    list: index,
                    label,
                    agent: agent.clone(),
                    expected: lens.len(),
                    found: bases.len(),
                });
            }
            RegionMap::from_bases(bases, &lens)
        }
        (_, other) => {
            return Err(Difference::DlistTarget {
                list: index,
                label,
                found: match other {
                    DlistTarget::Local => super::format::LOCAL_TARGET.to_string(),
                    DlistTarget::Remote(name) => format!("remote agent `{name}`"),
                },
            })
        }
    };
    if expected.mem != found.mem {
        return Err(Difference::DlistMem {
            list: index,
            label,
            expected: expected.mem,
            found: found.mem,
        });
    }
    let want = case.normalized_rows(index);
    let mut got = found.list.rows().map(|r| map.normalize(r));
    for (row, w) in want.iter().enumerate() {
        match got.next() {
            Some(g) if g == *w => {}
            Some(g) => {
                return Err(Difference::DlistRow {
                    list: index,
                    label,
                    row,
                    expected: *w,
                    found: g,
                })
            }
            None => break,
        }
    }
    let found_len = found.list.len() as usize;
    if want.len() != found_len {
        return Err(Difference::DlistRowCount {
            list: index,
            label,
            expected: want.len(),
            found: found_len,
        });
    }
    Ok(())
}

fn compare_ids(xfer: usize, side: Side, expected: &[u32], found: &[u32]) -> Result<(), Difference> {
    if let Some(pair) = expected.iter().zip(found).position(|(e, f)| e != f) {
        return Err(Difference::XferId {
            xfer,
            pair,
            side,
            expected: expected[pair],
            found: found[pair],
        });
    }
    if expected.len() != found.len() {
        return Err(Difference::XferPairCount {
            xfer,
            side,
            expected: expected.len(),
            found: found.len(),
        });
    }
    Ok(())
}

/// Compare block ids per KV-cache group (`what` names them in the report,
/// e.g. `"request_done remote_block_ids"`).
pub fn diff_block_ids(what: &str, expected: &[Vec<u64>], found: &[Vec<u64>]) -> DiffReport {
    compare_block_ids(what, expected, found).into()
}

fn compare_block_ids(
    what: &str,
    expected: &[Vec<u64>],
    found: &[Vec<u64>],
) -> Result<(), Difference> {
    for (group, (e, f)) in expected.iter().zip(found).enumerate() {
        if let Some(index) = e.iter().zip(f).position(|(a, b)| a != b) {
            return Err(Difference::BlockId {
                what: what.to_string(),
                group,
                index,
                expected: e[index],
                found: f[index],
            });
        }
        if e.len() != f.len() {
            return Err(Difference::BlockCount {
                what: what.to_string(),
                group,
                expected: e.len(),
                found: f.len(),
            });
        }
    }
    if expected.len() != found.len() {
        return Err(Difference::GroupCount {
            what: what.to_string(),
            expected: expected.len(),
            found: found.len(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_ids_report_the_first_differing_id() {
        let e = vec![vec![4, 5, 8, 9], vec![1]];
        assert_eq!(diff_block_ids("ids", &e, &e.clone()), DiffReport::Match);
        let f = vec![vec![4, 5, 7, 9], vec![1]];
        assert_eq!(
            diff_block_ids("request_done remote_block_ids", &e, &f).to_string(),
            "request_done remote_block_ids group 0 [2]: expected 8 found 7"
        );
        let short = vec![vec![4, 5, 8, 9]];
        assert_eq!(
            diff_block_ids("ids", &e, &short).to_string(),
            "ids: expected 2 groups found 1"
        );
        let fewer = vec![vec![4, 5], vec![1]];
        assert_eq!(
            diff_block_ids("ids", &e, &fewer).to_string(),
            "ids group 0: expected 4 ids found 2"
        );
    }
}
