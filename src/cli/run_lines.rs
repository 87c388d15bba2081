//! The part of `explain`'s text a driven connector's run adds, written
//! once for vLLM's connector and a replayed trace: each transfer of the
//! connector's log, every pair the oracles saw, and the violations.

use crate::oracle::{OracleInput, Violation};
use crate::under_test::judge::plan_keys;
use crate::under_test::ConnectorLog;

/// The transfers of `log`, the pairs of `observed` and `violations`, one
/// line each.
pub(super) fn run_lines(
    log: Option<&ConnectorLog>,
    observed: Option<&OracleInput>,
    violations: &[Violation],
) -> String {
    let mut out = String::new();
    for x in log.map(|l| l.xfers.as_slice()).unwrap_or_default() {
        out.push_str(&format!(
            "transfer: {} {} {} pairs (lists {} -> {}){}\n",
            x.agent,
            x.op,
            x.local_ids.len(),
            x.local,
            x.remote,
            if x.posted { "" } else { ", not posted" }
        ));
    }
    for key in observed.map(plan_keys).unwrap_or_default() {
        out.push_str(&format!("  pair: {key}\n"));
    }
    for v in violations {
        out.push_str(&format!("violation: {v}\n"));
    }
    out
}
