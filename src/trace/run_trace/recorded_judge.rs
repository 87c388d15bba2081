//! Judging a v2 trace ([`RecordedCase`]): `check-trace` runs kvgeom's oracles
//! on vLLM's own lists and transfers (descriptor level; byte level too when
//! the trace holds memory images), on the layout model of the rebuilt case,
//! exactly as the live sweep judges a case; `diff-trace` rebuilds the case
//! with kvgeom's connector under a policy and compares every list
//! ([`super::recorded_lists`]), every posted pair and the outcome with vLLM's.

use super::recorded::{RecordedCase, RecordedError, RecordedErrorKind};
use super::recorded_lists::{first_list_difference, rebuilt_lists, traced_lists, ListKey};
use crate::layout::Side;
use crate::live::connector_log;
use crate::live::pairs::resolve_pairs;
use crate::oracle::{self, MemoryImages, OracleInput, Violation};
use crate::scenario::{Case, Outcome, RunOptions};
use crate::trace::{smallest_explaining_set, Explanation};
use crate::under_test::judge::expected_outcome as judge;
use crate::under_test::judge::{compare_plans, plan_keys};
use crate::under_test::post_process_calls::{
    first_call_difference, kvgeom_calls, logged_calls, CallKey,
};
use crate::under_test::run_case_detailed;
use crate::variant::Variant;

/// The oracles' verdict on a v2 trace.
#[derive(Clone, Debug, PartialEq)]
pub enum RecordedCheck {
    /// vLLM ran the case; every oracle that applies passed.
    Passed {
        /// Whether byte-level oracles ran (the trace holds memory images).
        bytes_checked: bool,
    },
    /// vLLM refused the handshake.
    Rejected {
        /// vLLM's refusal.
        message: String,
        /// Whether the geometry expects this refusal.
        expected: bool,
    },
    /// Something is wrong with what vLLM did: violations, a crash, a hang,
    /// an id outside its list, or an accepted pair the geometry expects
    /// refused.
    Failed {
        /// What went wrong, first the outcome, then each violation.
        findings: Vec<String>,
    },
}

/// Whose connector the trace recorded, as the findings name it.
fn whose(rc: &RecordedCase) -> &'static str {
    match rc.code_under_test.connector {
        crate::under_test::ConnectorKind::Kvgeom => "kvgeom's",
        crate::under_test::ConnectorKind::Vllm => "vLLM's",
        crate::under_test::ConnectorKind::Sglang => "SGLang's",
    }
}

/// The outcome the driver reported, as kvgeom's scenario names it.
fn traced_outcome(rc: &RecordedCase) -> Result<Outcome, RecordedError> {
    let r = &rc.result;
    let message = r.message.clone().unwrap_or_default();
    let side = match r.side.as_deref() {
        Some("prefill") => Side::Prefill,
        _ => Side::Decode,
    };
    Ok(match r.status.as_str() {
        "done" => Outcome::Passed,
        "rejected" => Outcome::UnexpectedRejection { side, message },
        "crashed" => Outcome::Crashed { side, message },
        "hung" => Outcome::Hung { message },
        "error" => {
            return Err(RecordedError::new(
                &rc.path,
                RecordedErrorKind::DriverError(message),
            ))
        }
        other => {
            return Err(RecordedError::new(
                &rc.path,
                RecordedErrorKind::Status(other.to_string()),
            ))
        }
    })
}

/// Each transfer's ids against its lists: every id inside its list, as
/// many local as remote ids. (Real NIXL refuses such a transfer; the
/// resolution into pairs would skip the pair.)
pub(crate) fn id_findings(rc: &RecordedCase) -> Vec<String> {
    let rows = |agent: &str, handle: u64| {
        rc.result
            .dlists
            .iter()
            .find(|d| d.agent == agent && d.handle == handle)
            .map(|d| d.rows.len())
    };
    let mut out = Vec::new();
    for (i, x) in rc.result.xfers.iter().enumerate() {
        if x.local_ids.len() != x.remote_ids.len() {
            out.push(format!(
                "transfer {i} ({}): {} local ids but {} remote ids",
                x.agent,
                x.local_ids.len(),
                x.remote_ids.len()
            ));
        }
        for (which, handle, ids) in [
            ("local", x.local, &x.local_ids),
            ("remote", x.remote, &x.remote_ids),
        ] {
            let Some(n) = rows(&x.agent, handle) else {
                continue; // resolve_pairs names the unknown list
            };
            if let Some(id) = ids.iter().find(|&&id| id as usize >= n) {
                out.push(format!(
                    "transfer {i} ({}): {which} id {id} is beyond list {handle}'s {n} rows",
                    x.agent
                ));
            }
        }
    }
    out
}

/// vLLM's transfers as kvgeom's oracles see them, with the trace's memory
/// images when it holds them.
fn oracle_input(rc: &RecordedCase) -> Result<OracleInput, RecordedError> {
    let p = rc.prepared();
    let pairs = resolve_pairs(&rc.result, p)
        .map_err(|e| RecordedError::new(&rc.path, RecordedErrorKind::Resolve(e.to_string())))?;
    let mut input = OracleInput::new(
        p.layout.clone(),
        rc.case.prompt_len,
        rc.case.prefix_hit,
        pairs,
    )
    .with_transferred_tokens(p.transferred_tokens);
    if let Some(memory) = &rc.memory {
        for (side, spec) in [
            (Side::Prefill, &rc.spec.prefill),
            (Side::Decode, &rc.spec.decode),
        ] {
            for rank in 0..spec.tp_size {
                let agent = side.agent_name(rank);
                let (mut before, mut after) = (Vec::new(), Vec::new());
                for region in 0..spec.regions {
                    // `RecordedCase::read` checked that every region has its images.
                    if let Some(images) = memory.get(&(agent.clone(), region)) {
                        before.push(images.before.clone());
                        after.push(images.after.clone().into());
                    }
                }
                let before = before.into();
                input.set_memory(side, rank, MemoryImages { before, after });
            }
        }
    }
    Ok(input)
}

/// Run the oracles on a v2 trace.
pub fn check_recorded(rc: &RecordedCase) -> Result<RecordedCheck, RecordedError> {
    let geometry = &rc.case.geometry;
    let mode = rc.case.mode;
    let traced = traced_outcome(rc)?;
    if traced != Outcome::Passed {
        return Ok(match judge(geometry, mode, traced, &[]) {
            Outcome::ExpectedRejection { message, .. } => RecordedCheck::Rejected {
                message,
                expected: true,
            },
            Outcome::UnexpectedRejection { message, .. } => RecordedCheck::Rejected {
                message,
                expected: false,
            },
            other => RecordedCheck::Failed {
                findings: vec![format!("{} connector {}", whose(rc), other.describe())],
            },
        });
    }
    let mut findings = id_findings(rc);
    let input = oracle_input(rc)?;
    let violations: Vec<Violation> = if rc.memory.is_some() {
        oracle::run_all(&input)
    } else {
        oracle::run_descriptor_level(&input)
    };
    let outcome = judge(geometry, mode, Outcome::Passed, &violations);
    if let Outcome::MissingRejection { expected } = &outcome {
        findings.insert(
            0,
            format!("the geometry expects vLLM to refuse the pair ({expected}) but it accepted it"),
        );
    }
    findings.extend(violations.iter().map(ToString::to_string));
    Ok(if findings.is_empty() {
        RecordedCheck::Passed {
            bytes_checked: rc.memory.is_some(),
        }
    } else {
        RecordedCheck::Failed { findings }
    })
}

/// How a v2 trace compares with kvgeom's rebuild.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordedDiff {
    /// The first difference, `None` when kvgeom's connector did what vLLM did.
    pub difference: Option<String>,
}

/// kvgeom's run options for a traced case: host memory under a device
/// platform, as the driver runs vLLM's connector.
fn as_the_driver_runs() -> RunOptions {
    RunOptions {
        device_platform: true,
        ..RunOptions::default()
    }
}

/// kvgeom's run options for a traced case as it was recorded: a driver's
/// (vLLM's connector) as the driver runs it; kvgeom's own connector as
/// its sweep runs it (host memory, host platform).
fn as_recorded(rc: &RecordedCase) -> RunOptions {
    match rc.code_under_test.connector {
        crate::under_test::ConnectorKind::Kvgeom => RunOptions::default(),
        _ => as_the_driver_runs(),
    }
}

/// A run's posted pairs, or its outcome when it made none.
type Plan = Result<Vec<String>, Outcome>;

/// What one run did, as diff-trace compares it.
struct RunKeys {
    plan: Plan,
    lists: Vec<ListKey>,
    calls: Vec<CallKey>,
}

/// vLLM's plan in the trace.
fn traced_plan(rc: &RecordedCase) -> Result<Plan, RecordedError> {
    let outcome = traced_outcome(rc)?;
    if outcome != Outcome::Passed {
        return Ok(Err(outcome));
    }
    let ids = id_findings(rc);
    if let Some(first) = ids.first() {
        return Err(RecordedError::new(
            &rc.path,
            RecordedErrorKind::Resolve(format!("vLLM's transfers cannot be resolved: {first}")),
        ));
    }
    Ok(Ok(plan_keys(&oracle_input(rc)?)))
}

/// What vLLM did in the trace.
fn traced_keys(rc: &RecordedCase) -> Result<RunKeys, RecordedError> {
    Ok(RunKeys {
        plan: traced_plan(rc)?,
        lists: traced_lists(rc),
        calls: logged_calls(&connector_log(&rc.result)),
    })
}

/// kvgeom's plan, lists and post-process calls for the traced case under
/// `variant` (or `policy`, which replaces it).
fn rebuilt_keys(rc: &RecordedCase, variant: Variant, opts: &RunOptions) -> RunKeys {
    let case = Case {
        variant,
        ..rc.case.clone()
    };
    // A request vLLM's scheduler made is rebuilt on the blocks it chose.
    let run = match rc.spec.requests {
        crate::live::RequestPath::Scheduler => crate::under_test::kvgeom::run_placed_detailed(
            &case,
            opts,
            crate::live::place::placed_from_spec(&case, &rc.spec),
        ),
        crate::live::RequestPath::Direct => run_case_detailed(&case, opts),
    };
    let plan = match (&run.report.outcome, &run.oracle_input) {
        (Outcome::Error { .. }, _) | (_, None) => Err(run.report.outcome.clone()),
        (_, Some(input)) => Ok(plan_keys(input)),
    };
    RunKeys {
        plan,
        lists: rebuilt_lists(&run),
        calls: kvgeom_calls(&run, rc.case.geometry.model.is_mla()),
    }
}

/// The first difference of two runs: when both made transfers, of their
/// lists first, then of their pairs, then of their receive post-process
/// calls; otherwise of how they ended.
fn first_difference(rc: &RecordedCase, kvgeom: &RunKeys, vllm: &RunKeys) -> Option<String> {
    let both_moved = kvgeom.plan.is_ok() && vllm.plan.is_ok();
    if both_moved {
        if let Some(d) = first_list_difference(&kvgeom.lists, &vllm.lists) {
            return Some(d);
        }
    }
    // Two runs without transfers differ when they end differently.
    compare_plans(&kvgeom.plan, &vllm.plan)
        .first_difference
        .or_else(|| {
            both_moved
                .then(|| {
                    first_call_difference(&connector_log(&rc.result), &kvgeom.calls, &vllm.calls)
                })
                .flatten()
        })
}

/// Rebuild the traced case with kvgeom's connector under `variant` and
/// compare its posted pairs (agent, region, offset and length of both ends)
/// and outcome with vLLM's.
pub fn diff_recorded(rc: &RecordedCase, variant: Variant) -> Result<RecordedDiff, RecordedError> {
    if let Some(first) = id_findings(rc).into_iter().next() {
        return Ok(RecordedDiff {
            difference: Some(format!("vLLM's {first}")),
        });
    }
    let vllm = traced_keys(rc)?;
    let ours = rebuilt_keys(rc, variant, &as_recorded(rc));
    if let Err(Outcome::Error { message }) = &ours.plan {
        return Err(RecordedError::new(
            &rc.path,
            RecordedErrorKind::Rebuild(message.clone()),
        ));
    }
    Ok(RecordedDiff {
        difference: first_difference(rc, &ours, &vllm),
    })
}

/// The known defects whose policy reproduces a differing v2 trace exactly.
pub fn explain_recorded(rc: &RecordedCase) -> Explanation {
    let Ok(vllm) = traced_keys(rc) else {
        return Explanation::Unexplained;
    };
    smallest_explaining_set(&rc.vllm_version, |policy| {
        let opts = RunOptions {
            policy: Some(*policy),
            ..as_recorded(rc)
        };
        let ours = rebuilt_keys(rc, Variant::KVGEOM, &opts);
        !matches!(ours.plan, Err(Outcome::Error { .. }))
            && first_difference(rc, &ours, &vllm).is_none()
    })
}
