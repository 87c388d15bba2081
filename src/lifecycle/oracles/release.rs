//! Release: every block is freed exactly once, by the request that owns
//! it, never while a pair that reads or writes it is in flight, and every
//! block is free when the scenario ends.

use super::ledger::overlaps;
use super::{finding, Finding, LifecycleOracle, View};
use crate::lifecycle::record::Event;

/// The oracle's name.
pub const NAME: &str = "release";

/// The oracle.
pub struct Release;

impl LifecycleOracle for Release {
    fn name(&self) -> &'static str {
        NAME
    }

    fn observe(&mut self, event: &Event, view: &View<'_>) -> Vec<Finding> {
        let Event::Freed { block, request } = event else {
            return Vec::new();
        };
        let mut out = Vec::new();
        match view.ledger.owner(*block) {
            None => out.push(finding(
                NAME,
                view,
                Some(*request),
                format!("{block} freed by r{request} while free (a second free)"),
            )),
            Some(o) if o != *request => out.push(finding(
                NAME,
                view,
                Some(*request),
                format!("{block} freed by r{request} but owned by r{o}"),
            )),
            Some(_) => {}
        }
        let (offset, len) = view.pools.span(*block);
        let busy = view.ledger.in_flight.iter().find(|p| {
            overlaps(&p.src, block.engine, offset, len)
                || overlaps(&p.dst, block.engine, offset, len)
        });
        if let Some(p) = busy {
            out.push(finding(
                NAME,
                view,
                Some(*request),
                format!(
                    "{block} freed while a pair of r{} that touches it is in flight",
                    p.request
                ),
            ));
        }
        out
    }

    fn finish(&mut self, view: &View<'_>) -> Vec<Finding> {
        view.ledger
            .owned()
            .into_iter()
            .map(|(b, r)| {
                finding(
                    NAME,
                    view,
                    Some(r),
                    format!("{b} of r{r} is never freed within the scenario's bound"),
                )
            })
            .collect()
    }
}
