//! The vLLM driver's result read into the connector-neutral terms of
//! `under_test`: its log ([`connector_log`]) and its ending
//! ([`run_outcome`]). A live case and a recorded trace of one are both
//! converted here, so that `under_test` knows no driver protocol.

use super::protocol::CaseResult;
use crate::layout::Side;
use crate::under_test::{ConnectorLog, RunOutcome};

/// What the driver reported of vLLM's connector, connector-neutral.
pub fn connector_log(result: &CaseResult) -> ConnectorLog {
    ConnectorLog {
        regions: result.regions.clone(),
        dlists: result.dlists.clone(),
        xfers: result.xfers.clone(),
        post_process_calls: result.post_process_calls.clone(),
        region_zero_calls: result.region_zero_calls.clone(),
        handshakes: result.handshakes.clone(),
    }
}

/// The driver's `status`, `side` and `message` as the connector's ending
/// (`done`, `rejected`, `crashed`, `hung`; anything else: the driver could
/// not run the case, a harness error).
pub fn run_outcome(result: &CaseResult) -> RunOutcome {
    let message = result.message.clone().unwrap_or_default();
    let side = match result.side.as_deref() {
        Some("prefill") => Side::Prefill,
        _ => Side::Decode,
    };
    RunOutcome::from_driver_status(&result.status, side, message, |_, message| {
        format!("vLLM driver: {message}")
    })
}
