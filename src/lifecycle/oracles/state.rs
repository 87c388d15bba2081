//! State: a transferred mamba state is intact at its request's first
//! decode step (every byte is prefill's state for that request).

use super::{finding, Finding, LifecycleOracle, View};
use crate::lifecycle::content::state_byte;
use crate::lifecycle::record::Event;

/// The oracle's name.
pub const NAME: &str = "state";

/// The oracle.
pub struct State;

impl LifecycleOracle for State {
    fn name(&self) -> &'static str {
        NAME
    }

    fn observe(&mut self, event: &Event, view: &View<'_>) -> Vec<Finding> {
        let Event::FirstStep { request } = *event else {
            return Vec::new();
        };
        let Some(slot) = view
            .ledger
            .requests
            .get(request as usize)
            .and_then(|r| r.decode_state)
        else {
            return Vec::new();
        };
        let (offset, len) = view.pools.span(slot);
        let bytes = view.pools.read(slot.engine, offset, len);
        let wrong = bytes
            .iter()
            .enumerate()
            .filter(|(k, b)| **b != state_byte(request, *k as u32))
            .count();
        if wrong == 0 {
            return Vec::new();
        }
        vec![finding(
            NAME,
            view,
            Some(request),
            format!(
                "r{request}'s state in {slot} has {wrong} of {len} byte(s) wrong at its first step"
            ),
        )]
    }

    fn finish(&mut self, _: &View<'_>) -> Vec<Finding> {
        Vec::new()
    }
}
