//! Completion: every request ends exactly once (finished, preempted,
//! aborted or failed) within the scenario's bound, no request ends twice,
//! and a request prefill failed ends as failed or aborted on decode (the
//! failure reaches decode).

use std::collections::{HashMap, HashSet};

use super::{finding, Finding, LifecycleOracle, View};
use crate::lifecycle::operation::RequestId;
use crate::lifecycle::record::{End, Event};

/// The oracle's name.
pub const NAME: &str = "completion";

/// The oracle: the ends seen so far.
#[derive(Default)]
pub struct Completion {
    ends: HashMap<RequestId, End>,
    prefill_failed: HashSet<RequestId>,
    submitted: Vec<RequestId>,
}

impl LifecycleOracle for Completion {
    fn name(&self) -> &'static str {
        NAME
    }

    fn observe(&mut self, event: &Event, view: &View<'_>) -> Vec<Finding> {
        match *event {
            Event::Submitted { request, .. } => {
                self.submitted.push(request);
                Vec::new()
            }
            Event::PrefillFailed { request } => {
                self.prefill_failed.insert(request);
                Vec::new()
            }
            Event::Ended { request, end } => {
                let mut out = Vec::new();
                if let Some(before) = self.ends.insert(request, end) {
                    out.push(finding(
                        NAME,
                        view,
                        Some(request),
                        format!("r{request} ended twice: {before:?}, then {end:?}"),
                    ));
                }
                if self.prefill_failed.contains(&request)
                    && !matches!(end, End::Failed | End::Aborted)
                {
                    out.push(finding(
                        NAME,
                        view,
                        Some(request),
                        format!("r{request} failed on prefill but ended {end:?} on decode"),
                    ));
                }
                out
            }
            _ => Vec::new(),
        }
    }

    fn finish(&mut self, view: &View<'_>) -> Vec<Finding> {
        self.submitted
            .iter()
            .filter(|r| !self.ends.contains_key(r))
            .map(|&r| {
                let why = if self.prefill_failed.contains(&r) {
                    " (prefill failed it; the failure never reached decode)"
                } else {
                    ""
                };
                finding(
                    NAME,
                    view,
                    Some(r),
                    format!("r{r} never ended within the scenario's bound{why}"),
                )
            })
            .collect()
    }
}
