//! Isolation: no byte of a request's blocks changes except by its own
//! transfer, post-process or allocation. Every write the connector makes
//! and every pair that lands must touch only blocks its request owns at
//! that moment, on both engines: a late write into a block reused by the
//! next request, or a read of blocks reaped and given to another, breaks it.

use super::ledger::blocks_of;
use super::{finding, Finding, LifecycleOracle, View};
use crate::lifecycle::record::{Event, Span};

/// The oracle's name.
pub const NAME: &str = "isolation";

/// The oracle.
pub struct Isolation;

fn check(view: &View<'_>, span: &Span, request: u32, what: &str) -> Vec<Finding> {
    blocks_of(view.pools, span)
        .into_iter()
        .filter_map(|b| {
            let owner = view.ledger.owner(b);
            (owner != Some(request)).then(|| {
                let holder = owner.map_or("free".to_string(), |o| format!("owned by r{o}"));
                finding(
                    NAME,
                    view,
                    Some(request),
                    format!("{what} of r{request} touches {b}, {holder}"),
                )
            })
        })
        .collect()
}

impl LifecycleOracle for Isolation {
    fn name(&self) -> &'static str {
        NAME
    }

    fn observe(&mut self, event: &Event, view: &View<'_>) -> Vec<Finding> {
        match event {
            Event::Wrote {
                span,
                request,
                cause,
            } => check(view, span, *request, &format!("a {cause:?} write")),
            Event::Landed { pair } => {
                let mut f = check(view, &pair.src, pair.request, "a landed pair's source");
                f.extend(check(
                    view,
                    &pair.dst,
                    pair.request,
                    "a landed pair's destination",
                ));
                f
            }
            _ => Vec::new(),
        }
    }

    fn finish(&mut self, _: &View<'_>) -> Vec<Finding> {
        Vec::new()
    }
}
