//! Shrinking a failing scenario to a few operations: drop chunks of
//! operations (halves down to single ones) while the same oracle still
//! fires, then simplify what is left (land the first pair in flight, send
//! the heartbeats), until nothing smaller fails. Deterministic: the same
//! scenario shrinks to the same operations.

use super::error::LifecycleError;
use super::operation::Operation;
use super::runner::Scenario;

/// Runs one candidate at most this many times.
pub const MAX_CANDIDATES: u32 = 4000;

/// `scenario` without request `request`: its submit and every operation
/// naming it gone, the requests submitted after it one lower.
fn without_request(scenario: &Scenario, request: u32) -> Scenario {
    let mut out = scenario.clone();
    let mut seen = 0;
    out.operations.retain(|op| {
        if let Operation::Submit { .. } = op {
            seen += 1;
            return seen - 1 != request;
        }
        op.request() != Some(request)
    });
    for op in &mut out.operations {
        if let Some(r) = op.request_mut() {
            if *r > request {
                *r -= 1;
            }
        }
    }
    out
}

/// The smallest scenario found for which `fails` holds (`scenario` itself
/// must fail).
pub fn shrink(
    scenario: &Scenario,
    mut fails: impl FnMut(&Scenario) -> Result<bool, LifecycleError>,
) -> Result<Scenario, LifecycleError> {
    let mut best = scenario.clone();
    let mut budget = MAX_CANDIDATES;
    let mut try_candidate =
        |candidate: &Scenario, budget: &mut u32| -> Result<bool, LifecycleError> {
            if *budget == 0 {
                return Ok(false);
            }
            *budget -= 1;
            fails(candidate)
        };
    loop {
        let mut improved = false;
        let mut chunk = best.operations.len().div_ceil(2).max(1);
        while chunk >= 1 {
            let mut start = 0;
            while start < best.operations.len() {
                let mut candidate = best.clone();
                let end = (start + chunk).min(candidate.operations.len());
                candidate.operations.drain(start..end);
                if try_candidate(&candidate, &mut budget)? {
                    best = candidate;
                    improved = true;
                } else {
                    start += chunk;
                }
            }
            if chunk == 1 {
                break;
            }
            chunk /= 2;
        }
        // Drop a request whole: its submit and its operations, the later
        // requests renumbered.
        let mut request = 0;
        while request
            < best
                .operations
                .iter()
                .filter(|o| matches!(o, Operation::Submit { .. }))
                .count() as u32
        {
            let candidate = without_request(&best, request);
            if try_candidate(&candidate, &mut budget)? {
                best = candidate;
                improved = true;
            } else {
                request += 1;
            }
        }
        for i in 0..best.operations.len() {
            let simpler = match best.operations[i] {
                Operation::Deliver { pick } if pick != 0 => Operation::Deliver { pick: 0 },
                Operation::Submit {
                    prompt,
                    prefix_hit_blocks,
                } if prefix_hit_blocks != 0 => Operation::Submit {
                    prompt,
                    prefix_hit_blocks: 0,
                },
                _ => continue,
            };
            let mut candidate = best.clone();
            candidate.operations[i] = simpler;
            if try_candidate(&candidate, &mut budget)? {
                best = candidate;
                improved = true;
            }
        }
        if !improved || budget == 0 {
            return Ok(best);
        }
    }
}
