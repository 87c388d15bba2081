//! Admission: a decode block enters the prefix cache only when every byte
//! of it was written since its allocation (transferred, computed or
//! zeroed).

use std::collections::HashMap;

use super::ledger::blocks_of;
use super::{finding, Finding, LifecycleOracle, View};
use crate::lifecycle::operation::Engine;
use crate::lifecycle::pools::BlockRef;
use crate::lifecycle::record::{Event, Span, WriteCause};

/// The oracle's name.
pub const NAME: &str = "admission";

/// The oracle: which bytes of each decode block were written since its
/// allocation.
#[derive(Default)]
pub struct Admission {
    written: HashMap<BlockRef, Vec<bool>>,
}

impl Admission {
    fn mark(&mut self, view: &View<'_>, span: &Span) {
        if span.engine != Engine::Decode {
            return;
        }
        for b in blocks_of(view.pools, span) {
            let (offset, len) = view.pools.span(b);
            let bits = self
                .written
                .entry(b)
                .or_insert_with(|| vec![false; len as usize]);
            let from = span.offset.max(offset) - offset;
            let to = (span.offset + span.len).min(offset + len) - offset;
            bits[from as usize..to as usize].fill(true);
        }
    }
}

impl LifecycleOracle for Admission {
    fn name(&self) -> &'static str {
        NAME
    }

    fn observe(&mut self, event: &Event, view: &View<'_>) -> Vec<Finding> {
        match event {
            Event::Allocated { block, .. } => {
                self.written.remove(block);
            }
            Event::Wrote { span, cause, .. } if *cause != WriteCause::Allocation => {
                self.mark(view, span);
            }
            Event::Landed { pair } => self.mark(view, &pair.dst),
            Event::Admitted { request, block } => {
                let unwritten = self
                    .written
                    .get(block)
                    .map_or(view.pools.span(*block).1 as usize, |bits| {
                        bits.iter().filter(|w| !**w).count()
                    });
                if unwritten > 0 {
                    return vec![finding(
                        NAME,
                        view,
                        Some(*request),
                        format!(
                            "{block} of r{request} entered the prefix cache with {unwritten} \
                             byte(s) never written"
                        ),
                    )];
                }
            }
            _ => {}
        }
        Vec::new()
    }

    fn finish(&mut self, _: &View<'_>) -> Vec<Finding> {
        Vec::new()
    }
}
