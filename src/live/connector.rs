//! vLLM's Python connector as a connector under test: placed as kvgeom's
//! scenario places a request (the driver sends vLLM's workers the request
//! kvgeom made), run a whole batch at a time in driver processes
//! (`live::run_in_scratch`), each driver report turned into a
//! [`RunRecord`] while its files are on disk, and judged by the one judge,
//! its plan compared with kvgeom's connector under vLLM 0.33.0's policy.

use std::path::Path;
use std::time::Duration;

use super::driver_log::{connector_log, run_outcome};
use super::pairs::resolve_pairs;
use super::protocol::CaseResult;
use super::run::{read_final_memory, read_result};
use super::{
    run_in_scratch, BatchError, BlockCheck, BlocksComparison, DriverCase, DriverSettings, Hooks,
    Interpreter, Prepared, RequestPath, Requests, SchedulerComparison,
};
use crate::connector::NamedPolicy;
use crate::layout::Side;
use crate::oracle::{MemoryImages, OracleInput};
use crate::scenario::shape_and_place;
use crate::scenario::{Case, CaseReport, RunOptions};
use crate::under_test::judge::{
    compare_plans, judge, not_run, plan_keys, plan_of, with_post_process, Plan, PlanComparison,
};
use crate::under_test::kvgeom::run_placed_detailed;
use crate::under_test::post_process_calls::{kvgeom_calls, CallKey};
use crate::under_test::{ConnectorUnderTest, Placed, Release, RunLog, RunOutcome, RunRecord};
use crate::variant::Variant;

/// One live case: its report (judged on vLLM's final memory) and the plan comparison.
pub struct LiveReport {
    /// The case judged on vLLM's real final memory.
    pub report: CaseReport,
    /// vLLM's transfers against kvgeom's plan.
    pub plan: PlanComparison,
    /// What the driver returned, for `explain` and the tests.
    pub result: Option<CaseResult>,
    /// What the oracles judged, for `explain`.
    pub oracle_input: Option<OracleInput>,
    /// vLLM's blocks against the geometry's, for a geometry that names its
    /// model config (`None` for any other).
    pub blocks: Option<BlocksComparison>,
    /// For a vLLM other than the pinned one: vLLM's transfers against
    /// kvgeom's own connector (`--policy kvgeom`) as well; `None` for the
    /// pinned vLLM, which [`plan`](Self::plan) alone judges.
    pub plan_kvgeom: Option<PlanComparison>,
    /// How the case's request reached vLLM's workers.
    pub request_path: RequestPath,
    /// A case placed by vLLM's scheduler: kvgeom's scheduler model
    /// (`src/scheduler.rs`) against what vLLM's scheduler decided.
    pub scheduler_model: Option<SchedulerComparison>,
    /// Seconds the place phase spent on the case (scheduler cases).
    pub place_seconds: Option<f64>,
    /// For each defect probe the run was asked for (`kvgeom matrix`) that
    /// this case exposes (kvgeom's plans with and without the defect's
    /// decision differ): which of the two vLLM's plan equals.
    pub probes: Vec<(crate::defects::Defect, ProbeSeen)>,
}

/// One defect's decision toggled on a base policy: kvgeom's plan `with` it
/// and `without` it (`kvgeom matrix` asks every case which of them vLLM's
/// plan equals).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DefectProbe {
    /// The defect.
    pub defect: crate::defects::Defect,
    /// The base policy with the defect's decision.
    pub with: crate::connector::Policy,
    /// The base policy without it.
    pub without: crate::connector::Policy,
}

impl DefectProbe {
    /// One probe per known defect around the policy of `base` (a release's
    /// defects): a defect of `base` is probed by leaving it out, any other
    /// by adding it.
    pub fn around(base: &[crate::defects::Defect]) -> Vec<DefectProbe> {
        use crate::defects::{policy_with, Defect};
        Defect::ALL
            .into_iter()
            .map(|defect| {
                let others: Vec<Defect> = base.iter().copied().filter(|d| *d != defect).collect();
                let mut with_it = others.clone();
                with_it.push(defect);
                DefectProbe {
                    defect,
                    with: policy_with(&with_it),
                    without: policy_with(&others),
                }
            })
            .collect()
    }
}

/// Which of a probe's two plans vLLM's equals on a case that exposes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProbeSeen {
    /// The plan with the defect's decision.
    With,
    /// The plan without it.
    Without,
    /// Neither: vLLM differs from both on this case (another change).
    Neither,
}

/// What a batch keeps of each judged case beyond its report and plan
/// comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Retention {
    /// The driver's result and the oracle input (every rank's memory
    /// images), for `explain` and the tests.
    Everything,
    /// Neither: a sweep's memory then stays within one driver batch.
    Verdicts,
}

/// What one case's run through vLLM's connector left: the neutral run
/// record the one judge reads, and what only vLLM's driver reports.
pub struct VllmRecord {
    /// The run record (its log converted from the driver's result).
    pub run: RunRecord,
    /// The driver's result, when it wrote one.
    pub result: Option<CaseResult>,
    /// vLLM's blocks against the geometry's, for a geometry that names its
    /// model config.
    pub blocks: Option<BlocksComparison>,
}

/// vLLM's Python connector, run by driver processes.
pub struct VllmConnector<'a> {
    /// How the driver processes run (the interpreter, the block checks,
    /// the time-out of a case, the test hooks, how many at once).
    pub driver: DriverSettings<'a>,
}

impl ConnectorUnderTest for VllmConnector<'_> {
    type Error = BatchError;
    type Placement = Placed;
    type Record = VllmRecord;

    /// The driver sends vLLM's workers the request kvgeom's scenario
    /// places, so the placement is kvgeom's.
    fn place(&self, cases: &[Case]) -> Vec<Placed> {
        cases.iter().map(shape_and_place).collect()
    }

    /// The driver's chunks prepare each case for its placement when their
    /// turn comes (a batch holds at most a chunk's memory); a case whose
    /// placement failed gets a record saying why.
    fn run<T: Send>(
        &self,
        cases: &[Case],
        placed: Vec<Placed>,
        judge: &(dyn Fn(VllmRecord) -> T + Sync),
    ) -> Result<Vec<T>, BatchError> {
        run_in_scratch(cases, placed, self.driver, &|dc: DriverCase<'_>| {
            judge(driver_record(dc))
        })
    }
}

/// A driver case as a run record.
fn driver_record(dc: DriverCase<'_>) -> VllmRecord {
    let case = dc.case;
    let blocks = dc.blocks;
    let not_run = |outcome| VllmRecord {
        run: RunRecord::not_run(case, outcome),
        result: None,
        blocks: blocks.clone(),
    };
    let p = match dc.prepared {
        Ok(p) => p,
        Err(outcome) => return not_run(RunOutcome::from_outcome(outcome)),
    };
    let result = match read_result(&dc.case_dir, dc.nixl) {
        Ok(r) => r,
        Err(e) => {
            let outcome = if dc.killed {
                RunOutcome::Hung {
                    message:
                        "the vLLM driver was stopped at its time-out before this case finished"
                            .into(),
                }
            } else {
                RunOutcome::NotRun {
                    message: format!("the vLLM driver left no result: {e}"),
                }
            };
            return not_run(outcome);
        }
    };
    let outcome = run_outcome(&result);
    let observed = match &outcome {
        RunOutcome::Completed => observed(&dc.case_dir, case, p, &result),
        RunOutcome::NotRun { message } => Err((outcome.clone(), message.clone())),
        _ => Ok(None),
    };
    let (outcome, observed, uncompared) = match observed {
        Ok(observed) => (outcome, observed, None),
        Err((outcome, why)) => (outcome, None, Some(why)),
    };
    let run = RunRecord {
        case: case.clone(),
        outcome,
        observed,
        bytes_observed: true,
        zeroed_bytes: 0,
        // vLLM owns the tensors: kvgeom's estimate of its own run does not apply.
        memory_bytes: 0,
        log: RunLog::Driver(Box::new(connector_log(&result))),
        uncompared,
    };
    VllmRecord {
        run,
        result: Some(result),
        blocks,
    }
}

/// What the oracles judge of a completed driver case: vLLM's pairs on
/// kvgeom's layout model and every rank's memory (the initial images
/// kvgeom prepared, the final ones the driver wrote); `Err`: the harness
/// cannot use the driver's output, and why the plans are not compared.
fn observed(
    case_dir: &Path,
    case: &Case,
    p: Prepared,
    result: &CaseResult,
) -> Result<Option<OracleInput>, (RunOutcome, String)> {
    let not_run = |message: String, why: &str| (RunOutcome::NotRun { message }, why.to_string());
    let pairs = resolve_pairs(result, &p)
        .map_err(|e| not_run(e.to_string(), "its transfers could not be resolved"))?;
    let finals =
        read_final_memory(case_dir, &p).map_err(|e| not_run(e.to_string(), "no final memory"))?;
    let Prepared {
        layout,
        transferred_tokens,
        before,
        ..
    } = p;
    let mut input = OracleInput::new(layout, case.prompt_len, case.prefix_hit, pairs)
        .with_transferred_tokens(transferred_tokens);
    let sides = [Side::Prefill, Side::Decode];
    for ((side, befores), finals) in sides.into_iter().zip(before).zip(finals) {
        for (rank, (before, after)) in befores.into_iter().zip(finals).enumerate() {
            input.set_memory(
                side,
                rank as u32,
                MemoryImages {
                    before: before.into(),
                    after,
                },
            );
        }
    }
    Ok(Some(input))
}

/// kvgeom's run of a case: its plan and post-process calls.
struct Reference {
    plan: Plan,
    calls: Vec<CallKey>,
}

impl Reference {
    /// kvgeom's connector on `case` under `policy`, for the blocks vLLM's
    /// scheduler gave the request (`placed`) or else kvgeom's own placement.
    fn of(case: &Case, policy: NamedPolicy, placed: Option<&Placed>) -> Self {
        let case = Case {
            variant: Variant::Policy(policy),
            ..case.clone()
        };
        Self::run(&case, &RunOptions::default(), placed)
    }

    /// kvgeom's connector on `case` under the decisions `policy`, for the
    /// blocks `placed` (or kvgeom's own placement).
    fn of_policy(case: &Case, policy: crate::connector::Policy, placed: Option<&Placed>) -> Self {
        let opts = RunOptions {
            policy: Some(policy),
            ..RunOptions::default()
        };
        Self::run(case, &opts, placed)
    }

    fn run(case: &Case, opts: &RunOptions, placed: Option<&Placed>) -> Self {
        let placed = placed
            .cloned()
            .unwrap_or_else(|| crate::scenario::shape_and_place(case));
        let run = run_placed_detailed(case, opts, placed);
        Reference {
            plan: plan_of(run.oracle_input.as_ref(), &run.report.outcome),
            calls: kvgeom_calls(&run, case.geometry.model.is_mla()),
        }
    }

    /// The same plan and post-process calls as `other`.
    fn same_as(&self, other: &Reference) -> bool {
        self.calls == other.calls && compare_plans(&self.plan, &other.plan).equal
    }

    /// A driver record's plan against this one.
    fn compare(&self, record: &RunRecord, judged: &crate::scenario::Outcome) -> PlanComparison {
        let plan = match &record.observed {
            Some(input) => Ok(plan_keys(input)),
            None => Err(judged.clone()),
        };
        let compared = compare_plans(&self.plan, &plan);
        match (record.driver_log(), plan.is_ok()) {
            (Some(log), true) => with_post_process(compared, log, &self.calls),
            _ => compared,
        }
    }
}

/// The policy a live case is compared with: the one it carries (the
/// reference of the code under test), else the pinned release's.
fn reference_policy(case: &Case) -> NamedPolicy {
    match case.variant {
        Variant::Policy(policy) => policy,
        Variant::Defect(_) => Release::pinned().policy,
    }
}

/// Each probe `record` exposes, and which of its plans vLLM's equals; each
/// distinct policy is run once.
fn probe_case(
    record: &RunRecord,
    probes: &[DefectProbe],
    placed: Option<&Placed>,
) -> Vec<(crate::defects::Defect, ProbeSeen)> {
    if probes.is_empty() || record.uncompared.is_some() {
        return Vec::new();
    }
    let judged = record.outcome.to_outcome();
    let mut runs: Vec<(crate::connector::Policy, Reference, bool)> = Vec::new();
    for probe in probes {
        for policy in [probe.with, probe.without] {
            if !runs.iter().any(|(p, _, _)| *p == policy) {
                let reference = Reference::of_policy(&record.case, policy, placed);
                let equal = reference.compare(record, &judged).equal
                    && same_exception(&reference.plan, record, &judged);
                runs.push((policy, reference, equal));
            }
        }
    }
    let find = |policy: crate::connector::Policy| runs.iter().find(|(p, _, _)| *p == policy);
    let mut out = Vec::new();
    for probe in probes {
        let (Some(with), Some(without)) = (find(probe.with), find(probe.without)) else {
            continue;
        };
        if with.1.same_as(&without.1) {
            continue;
        }
        let seen = match (with.2, without.2) {
            (true, false) => ProbeSeen::With,
            (false, true) => ProbeSeen::Without,
            (false, false) => ProbeSeen::Neither,
            (true, true) => continue,
        };
        out.push((probe.defect, seen));
    }
    out
}

/// Where vLLM stopped without moving bytes (a crash or a refusal), a plan
/// that stopped the same way answers a probe only when its message says
/// the same: the same exception type, or vLLM's words (after the type)
/// among kvgeom's. Two stops alike in kind only are no evidence of the
/// same decision.
fn same_exception(reference: &Plan, record: &RunRecord, judged: &crate::scenario::Outcome) -> bool {
    if record.observed.is_some() {
        return true;
    }
    match (reference, stop_message(judged)) {
        (Err(k), Some(v)) => stop_message(k).is_none_or(|k| same_stop_words(k, v)),
        _ => true,
    }
}

fn stop_message(outcome: &crate::scenario::Outcome) -> Option<&str> {
    use crate::scenario::Outcome::{Crashed, ExpectedRejection, UnexpectedRejection};
    match outcome {
        Crashed { message, .. }
        | UnexpectedRejection { message, .. }
        | ExpectedRejection { message, .. } => Some(message),
        _ => None,
    }
}

/// The first exception type a message names (`IndexError`, ...).
fn exception_type(message: &str) -> Option<&str> {
    message
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .find(|w| w.len() > 5 && (w.ends_with("Error") || w.ends_with("Exception")))
}

/// kvgeom's stop message `k` says what vLLM's `v` says.
fn same_stop_words(k: &str, v: &str) -> bool {
    if let (Some(a), Some(b)) = (exception_type(k), exception_type(v)) {
        return a == b;
    }
    let rest = match exception_type(v) {
        Some(t) => v.split_once(&format!("{t}:")).map_or(v, |(_, r)| r),
        None => v,
    };
    let words: Vec<&str> = rest.split_whitespace().take(4).collect();
    !words.is_empty() && k.contains(&words.join(" "))
}

/// Judge one driver case: the record, its report, its plan against
/// kvgeom's under the reference policy (and, for a vLLM kvgeom does not
/// model, under kvgeom's own), and the defect probes asked for.
fn judge_driver_case(
    record: VllmRecord,
    pinned: bool,
    retention: Retention,
    probes: &[DefectProbe],
    placed: Option<&Placed>,
) -> LiveReport {
    let VllmRecord {
        run: mut record,
        result,
        blocks,
    } = record;
    let probed = probe_case(&record, probes, placed);
    let report = judge(&record);
    let case = &record.case;
    let plan = match &record.uncompared {
        Some(why) => not_run(why),
        // The connector's own ending (a refusal before the judge names it
        // expected) is compared.
        // The case carries the reference policy (the code under test's).
        None => Reference::of(case, reference_policy(case), placed)
            .compare(&record, &record.outcome.to_outcome()),
    };
    let ran = record.driver_log().is_some();
    let plan_kvgeom = (!pinned && ran).then(|| {
        Reference::of(case, NamedPolicy::Kvgeom, placed).compare(&record, &report.outcome)
    });
    let (result, oracle_input) = match retention {
        Retention::Everything => (result, record.observed.take()),
        Retention::Verdicts => (None, None),
    };
    LiveReport {
        report,
        plan,
        result,
        oracle_input,
        blocks,
        plan_kvgeom,
        probes: probed,
        request_path: RequestPath::Direct,
        scheduler_model: None,
        place_seconds: None,
    }
}

/// Run every case through vLLM's connector, in driver batches of at most
/// [`CHUNK_MEMORY_BYTES`](super::CHUNK_MEMORY_BYTES) of initial
/// memory, keeping each case's driver result and oracle input. `Err` when
/// the driver cannot run at all (the caller exits 2).
pub fn run_batch(
    cases: &[Case],
    python: &Interpreter,
    case_limit: Duration,
) -> Result<Vec<LiveReport>, BatchError> {
    run_batch_with(cases, python, case_limit, false)
}

/// [`run_batch`] for a sweep: only each case's report and plan comparison
/// are kept (`result` and `oracle_input` are `None`), so that memory does
/// not grow with the number of cases; up to `drivers` driver processes run
/// at once.
pub fn run_sweep(
    cases: &[Case],
    checks: &[BlockCheck],
    python: &Interpreter,
    case_limit: Duration,
    drivers: usize,
) -> Result<Vec<LiveReport>, BatchError> {
    run_sweep_requests(
        cases,
        checks,
        python,
        case_limit,
        drivers,
        None,
        Requests::default(),
    )
}

/// [`run_sweep`] for `kvgeom matrix`, with the requests made as `requests`
/// says: each case also answers every defect probe it exposes
/// ([`LiveReport::probes`]), and `done` is told of each case as soon as it
/// is judged (progress).
pub fn run_sweep_probed(
    cases: &[Case],
    checks: &[BlockCheck],
    python: &Interpreter,
    drivers: usize,
    requests: Requests,
    probes: &[DefectProbe],
    done: &(dyn Fn(&Case) + Sync),
) -> Result<Vec<LiveReport>, BatchError> {
    let hooks = Hooks {
        requests,
        ..Hooks::default()
    };
    let pinned = python.reference.is_some();
    let connector = VllmConnector {
        driver: DriverSettings {
            python,
            checks,
            case_limit: super::CASE_LIMIT,
            hooks: &hooks,
            drivers,
        },
    };
    let placed = connector.place(cases);
    connector.run(cases, placed, &|record| {
        let judged = judge_driver_case(record, pinned, Retention::Verdicts, probes, None);
        done(&judged.report.case);
        judged
    })
}

/// [`run_batch`], optionally with vLLM's receive post-process skipped (a
/// test hook: a fault that only the bytes reveal).
pub fn run_batch_with(
    cases: &[Case],
    python: &Interpreter,
    case_limit: Duration,
    skip_receive_post_process: bool,
) -> Result<Vec<LiveReport>, BatchError> {
    let hooks = Hooks {
        skip_receive_post_process,
        ..Hooks::default()
    };
    run_batch_hooked(cases, python, case_limit, &hooks)
}

/// [`run_batch`] with test hooks.
pub fn run_batch_hooked(
    cases: &[Case],
    python: &Interpreter,
    case_limit: Duration,
    hooks: &Hooks,
) -> Result<Vec<LiveReport>, BatchError> {
    run_batch_checked(cases, &[], python, case_limit, hooks)
}

/// [`run_batch_hooked`], with vLLM's own block derivation run in the same
/// driver process on each check's deployment: every case of a checked
/// geometry (matched by name) gets [`LiveReport::blocks`].
pub fn run_batch_checked(
    cases: &[Case],
    checks: &[BlockCheck],
    python: &Interpreter,
    case_limit: Duration,
    hooks: &Hooks,
) -> Result<Vec<LiveReport>, BatchError> {
    judged(
        cases,
        checks,
        python,
        case_limit,
        hooks,
        Retention::Everything,
        1,
    )
}

fn judged(
    cases: &[Case],
    checks: &[BlockCheck],
    python: &Interpreter,
    case_limit: Duration,
    hooks: &Hooks,
    retention: Retention,
    drivers: usize,
) -> Result<Vec<LiveReport>, BatchError> {
    // A vLLM kvgeom models is compared with its release's policy only.
    let pinned = python.reference.is_some();
    let connector = VllmConnector {
        driver: DriverSettings {
            python,
            checks,
            case_limit,
            hooks,
            drivers,
        },
    };
    let placed = connector.place(cases);
    run_in_scratch(cases, placed, connector.driver, &|dc: DriverCase<'_>| {
        let request_path = dc.request_path;
        let info = dc.scheduler.clone().unwrap_or_default();
        let placed = info.placement.clone().map(Ok);
        LiveReport {
            request_path,
            scheduler_model: info.model,
            place_seconds: info.seconds,
            ..judge_driver_case(driver_record(dc), pinned, retention, &[], placed.as_ref())
        }
    })
}

/// [`run_sweep`], saving each case's v2 trace (docs/trace-format.md) into
/// `record_traces` when given, named by [`crate::driver::trace_file_name`],
/// with the requests made as `requests` says (`--requests`): the CLI's
/// sweep.
pub fn run_sweep_requests(
    cases: &[Case],
    checks: &[BlockCheck],
    python: &Interpreter,
    case_limit: Duration,
    drivers: usize,
    record_traces: Option<&Path>,
    requests: Requests,
) -> Result<Vec<LiveReport>, BatchError> {
    let hooks = Hooks {
        record_traces: record_traces.map(Path::to_path_buf),
        requests,
        ..Hooks::default()
    };
    judged(
        cases,
        checks,
        python,
        case_limit,
        &hooks,
        Retention::Verdicts,
        drivers,
    )
}

#[cfg(test)]
mod probe_tests {
    use super::*;
    use crate::defects::{policy_with, Defect};

    #[test]
    fn a_stop_answers_a_probe_only_when_its_message_says_the_same() {
        let ix = "IndexError: tuple index out of range";
        assert!(same_stop_words(
            &format!("completing the receive failed: {ix}"),
            ix
        ));
        assert!(same_stop_words(
            "decode rank 0: KV cache view cannot be partitioned into NIXL regions",
            "decode-0 register_kv_caches: AssertionError: KV cache view cannot be partitioned"
        ));
        assert!(!same_stop_words(
            "NIXL not found: descriptor 127",
            "RuntimeError: shape '[-1, 2, 4, 0, 8]' is invalid"
        ));
        assert!(!same_stop_words(
            "transfer planning refused: group 0",
            "AssertionError: "
        ));
        assert!(!same_stop_words("KeyError: x", ix));
    }

    #[test]
    fn probes_toggle_each_defect_on_the_base() {
        let base = [Defect::EndTrimAlignment, Defect::ConvOffsetsScaled];
        let probes = DefectProbe::around(&base);
        assert_eq!(probes.len(), Defect::ALL.len());
        for p in &probes {
            assert_ne!(p.with, p.without, "{}", p.defect);
            if base.contains(&p.defect) {
                assert_eq!(p.with, policy_with(&base));
            } else {
                assert_eq!(p.without, policy_with(&base));
            }
        }
    }
}
