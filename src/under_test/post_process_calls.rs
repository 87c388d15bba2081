//! The receive post-process calls a connector's log records (vLLM's live
//! driver, a recorded trace) and those of kvgeom's run of the case,
//! compared independent of addresses: per decode agent, each call's
//! block-size ratio, per attention group the local kernel blocks and
//! the remote-sized sub-blocks covered, whether it asks for the conversion,
//! and (when the trace measured them) the byte ranges it zeroed, by region
//! and offset.

use std::fmt;

use super::connector_log::ConnectorLog;
use super::covered_range::CoveredRange;
use crate::connector::post_process::{asks_for_conversion, zeroed_ranges};
use crate::layout::Side;
use crate::scenario::CaseRun;

/// A zeroed byte range: region index (`None`: outside every region), offset
/// in the region (the address when outside), length.
type Range = (Option<usize>, u64, u64);

/// One post-process call, independent of addresses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CallKey {
    agent: String,
    ratio: u32,
    groups: Vec<(u32, Vec<u32>, CoveredRange)>,
    convert: bool,
    /// Merged and sorted; `None` when the trace did not measure them.
    zeroed: Option<Vec<Range>>,
}

impl fmt::Display for CallKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ratio {}", self.agent, self.ratio)?;
        for (group, blocks, covered) in &self.groups {
            write!(f, ", group {group} blocks {blocks:?} covered {covered}")?;
        }
        write!(f, ", convert {}", self.convert)
    }
}

fn range_text(&(region, offset, len): &Range) -> String {
    match region {
        Some(r) => format!("r{r}+{offset}/{len}"),
        None => format!("unregistered {offset:#x}/{len}"),
    }
}

/// Sorted, with overlapping and touching ranges of one region joined.
fn merged(mut ranges: Vec<Range>) -> Vec<Range> {
    ranges.retain(|r| r.2 > 0);
    ranges.sort();
    let mut out: Vec<Range> = Vec::new();
    for (region, offset, len) in ranges {
        if let Some(last) = out.last_mut() {
            if last.0 == region && offset <= last.1.saturating_add(last.2) {
                last.2 = last.2.max(offset.saturating_add(len) - last.1);
                continue;
            }
        }
        out.push((region, offset, len));
    }
    out
}

/// Bytes in `ranges` (a hostile trace's lengths may not add up in a u64).
fn total(ranges: &[Range]) -> u64 {
    ranges.iter().fold(0u64, |sum, r| sum.saturating_add(r.2))
}

/// `addr` as (region, offset) among the agent's traced regions.
fn place(log: &ConnectorLog, agent: &str, addr: u64, len: u64) -> Range {
    let regions = log.regions.get(agent).map(Vec::as_slice).unwrap_or(&[]);
    for (i, &(base, bytes)) in regions.iter().enumerate() {
        if addr >= base && addr - base < bytes {
            return (Some(i), addr - base, len);
        }
    }
    (None, addr, len)
}

/// The post-process calls a connector's log records, in the order of their agents.
pub(crate) fn logged_calls(log: &ConnectorLog) -> Vec<CallKey> {
    let mut out: Vec<CallKey> = log
        .post_process_calls
        .iter()
        .map(|c| CallKey {
            agent: c.agent.clone(),
            ratio: c.block_size_ratio,
            groups: c.block_ids_list.clone(),
            convert: c.convert,
            zeroed: c.zeroed.as_ref().map(|ranges| {
                merged(
                    ranges
                        .iter()
                        .map(|&(addr, len)| place(log, &c.agent, addr, len))
                        .collect(),
                )
            }),
        })
        .collect();
    out.sort_by(|a, b| a.agent.cmp(&b.agent));
    out
}

/// kvgeom's post-process calls in its run of the case: one per decode rank that planned
/// any group, as vLLM batches a step's finished requests by ratio.
pub(crate) fn kvgeom_calls(run: &CaseRun, is_mla: bool) -> Vec<CallKey> {
    let mut out: Vec<CallKey> = run
        .post_process
        .iter()
        .filter(|(_, plans)| !plans.is_empty())
        .map(|(rank, plans)| {
            let ratio = plans[0].ratio;
            let geometries = run
                .decode_page_geometries
                .get(*rank as usize)
                .map(Vec::as_slice)
                .unwrap_or(&[]);
            CallKey {
                agent: Side::Decode.agent_name(*rank),
                ratio,
                groups: plans
                    .iter()
                    .map(|p| {
                        (
                            p.group as u32,
                            p.block_ids.clone(),
                            CoveredRange {
                                start: p.first_covered_sub_block,
                                stop: p.covered_sub_blocks,
                            },
                        )
                    })
                    .collect(),
                convert: asks_for_conversion(is_mla, ratio),
                zeroed: Some(merged(
                    zeroed_ranges(plans, geometries)
                        .into_iter()
                        .map(|(region, offset, len)| (Some(region), offset, len))
                        .collect(),
                )),
            }
        })
        .collect();
    out.sort_by(|a, b| a.agent.cmp(&b.agent));
    out
}

/// The first difference of kvgeom's post-process calls (`ours`) and
/// the connector's (`theirs`, from its `log`). Zeroed ranges are compared where the
/// driver measured them. A region-mapped zeroing in the log is a
/// difference: kvgeom's connector never takes that path.
pub(crate) fn first_call_difference(
    log: &ConnectorLog,
    ours: &[CallKey],
    theirs: &[CallKey],
) -> Option<String> {
    if let Some(call) = log.region_zero_calls.first() {
        return Some(format!(
            "post-process: vLLM zeroed region-mapped blocks on {} (its path for P and D \
             cache-group layouts that differ), which kvgeom's connector does not take",
            call.agent
        ));
    }
    for k in 0..ours.len().max(theirs.len()) {
        let (a, b) = match (ours.get(k), theirs.get(k)) {
            (Some(a), Some(b)) => (a, b),
            (Some(a), None) => {
                return Some(format!(
                    "post-process: kvgeom calls it ({a}), vLLM does not"
                ))
            }
            (None, Some(b)) => {
                return Some(format!(
                    "post-process: vLLM calls it ({b}), kvgeom does not"
                ))
            }
            (None, None) => break,
        };
        if (&a.agent, a.ratio, &a.groups, a.convert) != (&b.agent, b.ratio, &b.groups, b.convert) {
            return Some(format!(
                "post-process: kvgeom calls it with {a}; vLLM with {b}"
            ));
        }
        let (Some(za), Some(zb)) = (&a.zeroed, &b.zeroed) else {
            continue;
        };
        if za != zb {
            let only = |x: &[Range], y: &[Range]| x.iter().find(|r| !y.contains(r)).map(range_text);
            let detail = match (only(za, zb), only(zb, za)) {
                (Some(ka), Some(kb)) => format!("kvgeom zeroes {ka}, vLLM {kb}"),
                (Some(ka), None) => format!("kvgeom zeroes {ka}, which vLLM does not"),
                (None, Some(kb)) => format!("vLLM zeroes {kb}, which kvgeom does not"),
                (None, None) => "the zeroed ranges differ".to_string(),
            };
            return Some(format!(
                "post-process on {}: {detail} ({} ranges, {} bytes zeroed by kvgeom; {}, {} by vLLM)",
                a.agent,
                za.len(),
                total(za),
                zb.len(),
                total(zb)
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn touching_and_overlapping_ranges_of_one_region_join() {
        let m = merged(vec![
            (Some(0), 10, 5),
            (Some(0), 0, 10),
            (Some(1), 15, 1),
            (Some(0), 12, 10),
            (Some(0), 40, 0),
        ]);
        assert_eq!(m, vec![(Some(0), 0, 22), (Some(1), 15, 1)]);
    }
}
