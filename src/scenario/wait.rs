//! How long a case waits for real NIXL, and what a case that gave up was
//! still waiting for (the message of its `hung` outcome).

use std::time::Duration;

use crate::connector::PlannedRead;
use crate::nixl::{AgentId, Nixl, XferHandle, XferState};

/// Between two looks at transfers that complete in the background.
pub const POLL_INTERVAL: Duration = Duration::from_millis(1);

/// How long a case waits for its transfers and notifications
/// ([`crate::time_limits::completion_limit`]), or why the setting is unusable.
pub fn completion_limit() -> Result<Duration, crate::time_limits::TimeLimitError> {
    crate::time_limits::completion_limit()
}

/// How a case that stopped waiting words its wait: after how long and
/// under which limit (in-process transports never wait).
pub fn waited(patient: bool, limit: Duration) -> String {
    if patient {
        format!(
            "after {} ({})",
            crate::time_limits::seconds_text(limit),
            crate::time_limits::setting_text(crate::time_limits::COMPLETION_LIMIT_VAR, limit)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nixl::{DescList, DescRow, DlistTarget, DryRun, MemKind, XferOp};

    /// Two transfers of `agent` on the dry-run transport (nothing posted yet).
    fn two_xfers(t: &mut DryRun, agent: AgentId) -> [XferHandle; 2] {
        let rows = DescList::from_rows((0..3).map(|i| DescRow {
            addr: 0x1000 + i * 64,
            len: 64,
            dev: 0,
        }));
        let local = t
            .prepare_dlist(agent, &DlistTarget::Local, MemKind::Dram, &rows)
            .unwrap();
        let remote = t
            .prepare_dlist(
                agent,
                &DlistTarget::Remote("prefill-0".into()),
                MemKind::Dram,
                &rows,
            )
            .unwrap();
        let ids = [0, 1, 2];
        [0, 1].map(|_| {
            t.make_xfer(agent, XferOp::Read, local, &ids, remote, &ids, None)
                .unwrap()
        })
    }

    fn read(remote_rank: u32, xfer: Option<XferHandle>) -> PlannedRead {
        PlannedRead {
            remote_rank,
            local_block_ids: vec![vec![1]],
            remote_block_ids: vec![vec![2]],
            local_desc_ids: vec![0, 1, 2],
            remote_desc_ids: vec![0, 1, 2],
            notification: String::new(),
            xfer,
        }
    }

    #[test]
    fn only_unfinished_transfers_are_listed_with_their_state() {
        let mut t = DryRun::new();
        let decode = t.create_agent("decode-0").unwrap();
        let [a, b] = two_xfers(&mut t, decode);
        t.post_xfer(decode, a).unwrap();
        let reads = [read(0, Some(a)), read(1, Some(b)), read(2, None)];
        let pending = pending_reads(&mut t, decode, &reads);
        assert_eq!(pending, ["READ from prefill rank 1 (3 pairs): in progress"]);
        assert_eq!(
            pending_text(&pending),
            "; pending: READ from prefill rank 1 (3 pairs): in progress"
        );
        let writes = pending_writes(&mut t, &[(decode, a), (decode, b)]);
        assert_eq!(writes, ["WRITE 1 of decode-0: in progress"]);
        assert_eq!(pending_text(&[]), "");
    }

    #[test]
    fn a_transfer_the_transport_does_not_know_says_so() {
        let mut t = DryRun::new();
        let decode = t.create_agent("decode-0").unwrap();
        let pending = pending_reads(&mut t, decode, &[read(3, Some(XferHandle(99)))]);
        assert_eq!(pending.len(), 1);
        assert!(
            pending[0].starts_with("READ from prefill rank 3 (3 pairs): state unknown ("),
            "{pending:?}"
        );
    }

    #[test]
    fn the_wait_names_its_limit_only_when_the_case_waited() {
        assert_eq!(
            waited(true, Duration::from_secs(20)),
            "after 20 s (KVGEOM_COMPLETION_LIMIT_S=20)"
        );
        assert!(waited(false, Duration::ZERO).starts_with("after the post"));
    }
}
