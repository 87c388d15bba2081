//! How long a case waits for real NIXL, and what a case that gave up was
//! still waiting for (the message of its `hung` outcome).

use std::time::Duration;

use crate::connector::PlannedRead;
use crate::nixl::{AgentId, Nixl, XferHandle, XferState};

/// Between two looks at transfers that complete in the background.
pub const POLL_INTERVAL: Duration = Duration::from_millis(1);

/// How long a case waits for its transfers and notifications
/// ([`crate::limits::completion_limit`]), or why the setting is unusable.
pub fn completion_limit() -> Result<Duration, String> {
    crate::limits::completion_limit()
}

/// How a case that stopped waiting words its wait: after how long and
/// under which limit (in-process transports never wait).
pub fn waited(patient: bool, limit: Duration) -> String {
    if patient {
        format!(
            "after {} ({}={})",
            crate::limits::seconds_text(limit),
            crate::limits::COMPLETION_LIMIT_VAR,
            limit.as_secs_f64()
        )
    } else {
        "after the post (the transport completes transfers inside it)".into()
    }
}

/// The READs of `reads` that are not done, as "READ from prefill rank R
/// (N pairs): STATE", one per pending transfer.
pub fn pending_reads(nixl: &mut dyn Nixl, agent: AgentId, reads: &[PlannedRead]) -> Vec<String> {
    reads
        .iter()
        .filter_map(|r| {
            let x = r.xfer?;
            let state = describe(nixl.xfer_state(agent, x))?;
            Some(format!(
                "READ from prefill rank {} ({} pairs): {state}",
                r.remote_rank,
                r.local_desc_ids.len()
            ))
        })
        .collect()
}

/// The WRITEs of `writes` that are not done, as "WRITE N: STATE".
pub fn pending_writes(nixl: &mut dyn Nixl, writes: &[(AgentId, XferHandle)]) -> Vec<String> {
    writes
        .iter()
        .enumerate()
        .filter_map(|(i, &(agent, x))| {
            let state = describe(nixl.xfer_state(agent, x))?;
            let name = nixl
                .agent_name(agent)
                .unwrap_or_else(|_| format!("agent {}", agent.0));
            Some(format!("WRITE {i} of {name}: {state}"))
        })
        .collect()
}

/// `None` for a finished transfer, else what it is doing.
fn describe(state: Result<XferState, crate::nixl::NixlError>) -> Option<String> {
    match state {
        Ok(XferState::Done) => None,
        Ok(XferState::InProgress) => Some("in progress".into()),
        Err(e) => Some(format!("state unknown ({e})")),
    }
}

/// "; pending: a, b" or "" when nothing is listed.
pub fn pending_text(pending: &[String]) -> String {
    if pending.is_empty() {
        String::new()
    } else {
        format!("; pending: {}", pending.join(", "))
    }
}
