//! `kvgeom sweep --connector vllm`: the sweep's cases run through vLLM's
//! own NIXL connector (vllm-driver/), judged by kvgeom's oracles.

use super::pipeline::{
    nixl_fields, ran_line, resolve_nixl, Explained, Fields, Judged, OneCase, PipelineConnector,
    Swept,
};
use super::run_args::RequestsArg;
use super::{ExplainArgs, NixlArg, SweepArgs, EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK};
use crate::connector::NamedPolicy;
use crate::geometry::Mode;
use crate::live;
use crate::live::LiveReport;
use crate::report::sweep_report;
use crate::scenario::{shell_word, Case, CaseReport, MemoryKind, TransportKind};
use crate::sweep::plan::{self, PlanOptions};
use crate::sweep::shard::Shard;
use crate::under_test::expectations::Expectations;
use crate::under_test::plan_differences::PlanDifferences;
use crate::under_test::PlanComparison;
use crate::under_test::{judge_sweep, CodeUnderTest, Release};
use crate::variant::Variant;

/// The interpreter with vLLM and `--nixl` resolved for it; `Err` is the
/// exit status after the error was printed.
fn driver_python(
    flag: Option<&std::path::Path>,
    nixl: Option<NixlArg>,
) -> Result<live::Interpreter, u8> {
    let mut python = live::find(flag, Release::pinned().version).map_err(|e| {
        eprintln!("error: {e}");
        EXIT_BAD_INPUT
    })?;
    python.reference = python.code_under_test().reference_policy();
    let driver_dir = crate::driver::project_root().join("vllm-driver");
    python.nixl = resolve_nixl(&live::VLLM_DRIVER, &python.python, &driver_dir, nixl)?;
    Ok(python)
}

/// Why `--transport nixl` is refused with `--connector vllm`.
const TRANSPORT_NIXL: &str = "--transport nixl: --transport selects kvgeom's own transport; \
     with --connector vllm, --nixl real gives vLLM's workers real NIXL agents";

fn refused(args: &SweepArgs) -> Option<String> {
    if let Some(d) = &args.run.variant.defect {
        return Some(format!(
            "--defect {d}: defects are variants of kvgeom's connector; --connector vllm runs vLLM's own"
        ));
    }
    if let Some(p) = &args.run.variant.policy {
        return Some(format!(
            "--policy {p}: --connector vllm runs vLLM's own connector and compares it with its release's kvgeom policy (another with --compare-policy)"
        ));
    }
    if args.memory == MemoryKind::Vram {
        return Some(
            "--memory vram: the live mode runs vLLM's connector on host tensors (CPU only)".into(),
        );
    }
    if args.run.transport == TransportKind::Nixl {
        return Some(TRANSPORT_NIXL.into());
    }
    if args.compare_host {
        return Some("--compare-host: the live mode always runs on host memory".into());
    }
    None
}

/// `--requests` for a run of `allocations` (`None`: both): scheduler
/// unless asked for direct; `Err` (printed, exit 2) for scheduler requests
/// of with-last-token cases only.
pub(super) fn requests_option(
    asked: Option<RequestsArg>,
    allocations: Option<&[crate::scheduler::DecodeAllocation]>,
) -> Result<live::Requests, u8> {
    let only_last_token =
        allocations.is_some_and(|a| a == [crate::scheduler::DecodeAllocation::WithLastToken]);
    match asked {
        Some(RequestsArg::Direct) => Ok(live::Requests::Direct),
        Some(RequestsArg::Scheduler) if only_last_token => {
            eprintln!(
                "error: --requests scheduler --alloc with-last-token: with-last-token is the \
                 allocation of vLLM's tests, not of its scheduler (which allocates mainline); \
                 those cases run direct: drop --requests or use --requests direct"
            );
            Err(EXIT_BAD_INPUT)
        }
        Some(RequestsArg::Scheduler) | None => Ok(live::Requests::Scheduler),
    }
}

/// vLLM's own NIXL connector in the one sweep ([`super::pipeline`]):
/// the cases run in vLLM driver processes, each plan compared with the
/// release's kvgeom policy.
pub(crate) struct VllmPipeline {
    /// `--requests`: who makes the requests.
    requests: live::Requests,
    /// `--compare-policy`.
    compare_policy: Option<NamedPolicy>,
    /// The policy vLLM's plans are compared with, once the release is known.
    compared: Option<NamedPolicy>,
    /// `--plan-differences FILE`, read before the interpreter is probed;
    /// after it, the differences this sweep allows.
    plan_differences: Option<PlanDifferences>,
    /// `--threads`: how many driver processes run at once (by default
    /// `live::drivers_for` a batch's size).
    threads: Option<usize>,
    /// The interpreter with vLLM, once found.
    python: Option<live::Interpreter>,
    /// The vLLM it runs.
    under_test: Option<CodeUnderTest>,
    /// The release's expectations, when `--expect` names none.
    default_expectations: Option<Expectations>,
    /// The geometry files that name their model config: vLLM's own block
    /// derivation is compared with each.
    checks: Vec<live::BlockCheck>,
    /// The planned sources, for the block checks of this shard's cases.
    sources: Vec<plan::SourcedGeometry>,
    /// Every judged case, as the driver reported it.
    live: Vec<LiveReport>,
}

impl VllmPipeline {
    /// The connector before its options are read.
    pub(crate) fn new() -> Self {
        VllmPipeline {
            requests: live::Requests::Scheduler,
            compare_policy: None,
            compared: None,
            plan_differences: None,
            threads: None,
            python: None,
            under_test: None,
            default_expectations: None,
            checks: Vec::new(),
            sources: Vec::new(),
            live: Vec::new(),
        }
    }
}

impl PipelineConnector for VllmPipeline {
    fn refused(&self, args: &SweepArgs) -> Option<String> {
        refused(args)
    }

    fn options(&mut self, args: &SweepArgs) -> Result<(), u8> {
        self.requests = requests_option(args.run.requests, args.alloc.allocations().as_deref())?;
        self.compare_policy = compare_policy_option(args.compare_policy.as_deref())?;
        // A file named on the command line is checked before the
        // interpreter is probed; the release's own once it is known.
        self.plan_differences = args
            .plan_differences
            .as_deref()
            .map(load_plan_differences)
            .transpose()?;
        self.threads = super::sweep::threads_within_limit(args.threads)?;
        Ok(())
    }

    fn plan_options(&self, args: &SweepArgs, prompts: Option<Vec<u32>>) -> Result<PlanOptions, u8> {
        Ok(PlanOptions {
            prompts,
            modes: args.mode.modes(),
            allocations: args.alloc.allocations(),
            // Planned before the interpreter is probed; set again in
            // `start` to the reference of the release it has.
            variant: planned_variant(),
            seed: args.seed,
        })
    }

    fn start(
        &mut self,
        args: &SweepArgs,
        sources: &[plan::SourcedGeometry],
        cases: Vec<Case>,
    ) -> Result<Vec<Case>, u8> {
        // kvgeom's preparation of every case (of every shard) must fit
        // before the interpreter is probed or a driver starts.
        let budget = super::max_memory_option(args.run.max_memory.as_deref())?;
        super::prepared_cases_fit(&cases, &budget)?;
        let python = driver_python(args.run.vllm_python.as_deref(), args.run.nixl)?;
        let under_test = python.code_under_test();
        let compared = self
            .compare_policy
            .unwrap_or_else(|| python.compared_policy());
        if let Some(policy) = self.compare_policy {
            eprintln!(
                "note: --compare-policy {}: vLLM's plans are compared with kvgeom's --policy {} instead of {}",
                policy.name(),
                policy.name(),
                python.compared_policy().name()
            );
        }
        if self.plan_differences.is_none() {
            if let Some(release) = under_test.release() {
                let file = crate::driver::project_root().join(release.plan_differences());
                self.plan_differences = Some(load_plan_differences(&file)?);
            }
        }
        if under_test.release().is_none() {
            match &args.expect {
                Some(file) => eprintln!(
                    "note: {} is not a release kvgeom models: held to --expect {}; its plans are compared with --policy {} as information",
                    under_test.describe(),
                    file.display(),
                    compared.name()
                ),
                None => eprintln!(
                    "note: {} is not a release kvgeom models: the expectations do not apply; its plans are compared with --policy {} as information; the exit status is a plain sweep's",
                    under_test.describe(),
                    compared.name()
                ),
            }
            for file in under_test.modified_files.iter().take(5) {
                eprintln!("  modified: {file}");
            }
        }
        if args.expect.is_none() {
            let default = under_test
                .expectations()
                .map(|file| crate::driver::project_root().join(file));
            self.default_expectations = default
                .as_deref()
                .map(Expectations::load)
                .transpose()
                .map_err(|e| {
                    eprintln!("error: {e}");
                    EXIT_BAD_INPUT
                })?;
        }
        self.sources = sources.to_vec();
        self.compared = Some(compared);
        self.python = Some(python);
        self.under_test = Some(under_test);
        Ok(cases
            .into_iter()
            .map(|case| Case {
                variant: Variant::Policy(compared),
                ..case
            })
            .collect())
    }

    fn shard_key(&self, args: &SweepArgs) -> String {
        let mut key = format!("{:?} connector vllm", args.random);
        if let Some(python) = &self.python {
            key.push_str(&format!(" {}", python.vllm_version));
            if let Some(version) = python.nixl.version() {
                // Shards over real NIXL and over the stand-in never merge.
                key.push_str(&format!(" nixl real {version}"));
            }
        }
        if self.requests == live::Requests::Scheduler {
            // Shards of scheduler-made and direct requests never merge.
            key.push_str(" requests scheduler");
        }
        key
    }

    fn run(&mut self, args: &SweepArgs, cases: &[Case]) -> Result<Vec<Judged>, u8> {
        let (Some(python), Some(under_test)) = (&self.python, &self.under_test) else {
            // `start` found no interpreter: nothing ran.
            return Ok(Vec::new());
        };
        self.checks = block_checks(&self.sources, cases, &python.vllm_version);
        let started = std::time::Instant::now();
        // The canary runs first, in the same batch (live::canary).
        let variant = self.compared.map_or_else(planned_variant, Variant::Policy);
        let with_canary: Vec<Case> = std::iter::once(super::canary::canary_case(variant))
            .chain(cases.iter().cloned())
            .collect();
        let mut live = live::run_sweep_requests(
            &with_canary,
            &self.checks,
            python,
            live::CASE_LIMIT,
            live::drivers_for(self.threads, with_canary.len()),
            args.record_traces.as_deref(),
            self.requests,
        )
        .map_err(|e| {
            eprintln!("error: {e}");
            EXIT_BAD_INPUT
        })?;
        let canary = live.remove(0);
        if let Err(reason) = super::canary::verdict(&canary.report) {
            eprintln!(
                "error: {}: not run: {reason}; no verdict on this release counts (the driver does not drive it as it should)",
                under_test.describe()
            );
            return Err(EXIT_BAD_INPUT);
        }
        if let Some(allowed) = &self.plan_differences {
            mark_allowed(&mut live, allowed);
        }
        ran_line(
            under_test,
            &python.python,
            &python.nixl.to_string(),
            live.len(),
            started,
        );
        let nixl = nixl_fields(&python.nixl);
        let judged = live
            .iter()
            .map(|l| Judged {
                report: l.report.clone(),
                extras: case_fields(l, &nixl),
            })
            .collect();
        self.live = live;
        Ok(judged)
    }

    fn code_under_test(&self, _judged: &[Judged]) -> CodeUnderTest {
        self.under_test
            .clone()
            .unwrap_or_else(|| CodeUnderTest::vllm(Release::pinned().version))
    }

    fn expectations(
        &mut self,
        given: Option<Expectations>,
        _code: &CodeUnderTest,
    ) -> Result<Option<Expectations>, u8> {
        Ok(given.or_else(|| self.default_expectations.take()))
    }

    fn table(&self, _judged: &[Judged], _reports: &[CaseReport]) -> String {
        match &self.python {
            Some(python) => table(&self.live, &python.nixl),
            None => sweep_report::table(&[]),
        }
    }

    fn report_fields(&self) -> Fields {
        let mut fields = self
            .python
            .as_ref()
            .map(|p| nixl_fields(&p.nixl))
            .unwrap_or_default();
        fields.insert("connector".into(), "vllm".into());
        fields
    }

    fn refused_explain(&self, args: &ExplainArgs) -> Option<String> {
        if args.run.variant.defect.is_some() || args.run.variant.policy.is_some() {
            Some(
                "--defect and --policy select kvgeom's connector; --connector vllm runs vLLM's own"
                    .into(),
            )
        } else if args.run.transport == TransportKind::Nixl {
            Some(TRANSPORT_NIXL.into())
        } else if args.svg.is_some() {
            Some("--svg: not available with --connector vllm".into())
        } else {
            None
        }
    }

    fn explain_options(&mut self, args: &ExplainArgs) -> Result<(), u8> {
        self.requests = requests_option(args.run.requests, Some(&[args.alloc.allocation()]))?;
        Ok(())
    }

    fn one_case(
        &self,
        args: &ExplainArgs,
    ) -> Result<(Mode, crate::scheduler::DecodeAllocation, Variant), u8> {
        // Planned before the interpreter is probed (set in `explain`).
        Ok((args.mode.mode(), args.alloc.allocation(), planned_variant()))
    }

    fn explain(&mut self, args: &ExplainArgs, one: OneCase) -> Result<Explained, u8> {
        live_explain(args, one, self.requests)
    }

    fn verdict(&mut self, sweep: &Swept<'_>) -> u8 {
        let Swept {
            expectations, code, ..
        } = *sweep;
        let Some(python) = &self.python else {
            return EXIT_BAD_INPUT;
        };
        let exit = judge(&self.live, expectations, python.reference.is_some(), code);
        if let Some(allowed) = &self.plan_differences {
            unused_plan_differences(&self.live, allowed);
        }
        exit
    }

    fn run_candidates(&mut self, cases: &[Case]) -> Option<Vec<CaseReport>> {
        let python = self.python.as_ref()?;
        let tried = live::run_sweep_requests(
            cases,
            &[],
            python,
            live::CASE_LIMIT,
            live::drivers_for(self.threads, cases.len()),
            None,
            self.requests,
        );
        match tried {
            Ok(tried) => Some(tried.into_iter().map(|l| l.report).collect()),
            Err(e) => {
                eprintln!("note: shrinking failed ({e}); replays are of the cases as run");
                None
            }
        }
    }

    /// `kvgeom explain --connector vllm`, with what ran here: real NIXL,
    /// the interpreter (unless it is the project's venv), direct requests.
    fn replay_command(&self, case: &Case) -> String {
        let Some(python) = &self.python else {
            return live::live_replay_command(case);
        };
        let nixl = match python.nixl {
            crate::driver::NixlRun::Real { .. } => " --nixl real",
            crate::driver::NixlRun::StandIn => "",
        };
        let interpreter = match python.source {
            live::python::Source::ProjectVenv => String::new(),
            _ => format!(
                " --vllm-python {}",
                shell_word(&python.python.display().to_string())
            ),
        };
        // Scheduler-made requests are the default.
        let direct = match self.requests {
            live::Requests::Direct if case.allocation.as_str() == "mainline" => {
                " --requests direct"
            }
            _ => "",
        };
        format!(
            "{}{interpreter}{nixl}{direct}",
            live::live_replay_command(case)
        )
    }
}

/// A live case's own fields in the JSON report: the connector, what moved
/// the bytes (`nixl`), how the request was made, the plan comparisons, the
/// scheduler model and the blocks.
fn case_fields(l: &LiveReport, nixl: &Fields) -> Fields {
    let mut c = nixl.clone();
    let value = |v: Result<serde_json::Value, serde_json::Error>| v.unwrap_or_default();
    c.insert("connector".into(), "vllm".into());
    c.insert("request_path".into(), l.request_path.as_str().into());
    if let Some(m) = &l.scheduler_model {
        c.insert("scheduler_model".into(), value(serde_json::to_value(m)));
    }
    c.insert("plan".into(), value(serde_json::to_value(&l.plan)));
    if let Some(p) = &l.plan_kvgeom {
        c.insert("plan_kvgeom".into(), value(serde_json::to_value(p)));
    }
    if let Some(b) = &l.blocks {
        c.insert("blocks".into(), value(serde_json::to_value(b)));
    }
    c
}

/// `--compare-policy NAME`, or exit 2 naming the known policies.
fn compare_policy_option(name: Option<&str>) -> Result<Option<NamedPolicy>, u8> {
    let Some(name) = name else {
        return Ok(None);
    };
    NamedPolicy::from_name(name).map(Some).ok_or_else(|| {
        let known: Vec<&str> = NamedPolicy::ALL.iter().map(|p| p.name()).collect();
        eprintln!(
            "error: --compare-policy {name}: unknown policy; known: {}",
            known.join(", ")
        );
        EXIT_BAD_INPUT
    })
}

/// The allowed plan differences in `file`, or exit 2 after saying why not.
fn load_plan_differences(file: &std::path::Path) -> Result<PlanDifferences, u8> {
    PlanDifferences::load(file, &crate::driver::project_root()).map_err(|e| {
        eprintln!("error: {e}");
        EXIT_BAD_INPUT
    })
}

/// Mark each compared case whose plan differs and that an entry of
/// `allowed` covers with the entry's finding.
pub(super) fn mark_allowed(live: &mut [LiveReport], allowed: &PlanDifferences) {
    for l in live.iter_mut() {
        if l.plan.equal || l.report.outcome.not_reachable() {
            continue;
        }
        l.plan.allowed = allowed
            .allowing(&l.report.case, l.request_path.as_str())
            .map(|d| d.finding.clone());
    }
}

/// A note for each entry of `allowed` that allowed no difference in this
/// sweep: stale when the sweep ran its cases, else its cases did not run.
fn unused_plan_differences(live: &[LiveReport], allowed: &PlanDifferences) {
    for (index, d) in allowed.differences.iter().enumerate() {
        let used = live
            .iter()
            .any(|l| l.plan.allowed.is_some() && d.covers(&l.report.case, l.request_path.as_str()));
        if !used {
            eprintln!(
                "note: {}: difference #{} ({}) allowed no plan difference of this sweep (stale, or its cases did not run)",
                allowed.file,
                index + 1,
                d.describe()
            );
        }
    }
}

/// The geometries among `cases` that name their model config: vLLM's own
/// block derivation runs on each once. A file derived under another
/// release's rules (`model.vllm_release`) than the installed `vllm_version`
/// is left out, with a note: that release's vLLM would derive other blocks.
pub(super) fn block_checks(
    sources: &[plan::SourcedGeometry],
    cases: &[crate::scenario::Case],
    vllm_version: &str,
) -> Vec<live::BlockCheck> {
    sources
        .iter()
        .filter(|s| cases.iter().any(|c| c.geometry_name() == s.geometry.name))
        .filter_map(|s| {
            let m = s.model.as_ref()?;
            let rules = m.prefill.rules.release;
            if rules != vllm_version {
                eprintln!(
                    "note: {}: its blocks are derived under vLLM {rules}'s rules (model.vllm_release), \
                     so vLLM {vllm_version}'s own derivation is not compared with them",
                    s.file
                        .as_ref()
                        .map_or(s.geometry.name.clone(), |f| f.display().to_string())
                );
                return None;
            }
            Some(live::BlockCheck {
                geometry: std::sync::Arc::clone(&s.geometry),
                source: std::sync::Arc::clone(m),
            })
        })
        .collect()
}

/// One of a live case's plan comparisons.
type PlanOf = fn(&LiveReport) -> Option<&PlanComparison>;

/// Exit status: the expectations (or, without them, every case passing),
/// and, for a release kvgeom models, its plan equal to its policy's on every
/// case. For another vLLM the plan differences against each policy are
/// information.
fn judge(
    live: &[LiveReport],
    expectations: Option<&Expectations>,
    modelled: bool,
    code: &CodeUnderTest,
) -> u8 {
    let reports: Vec<CaseReport> = live.iter().map(|l| l.report.clone()).collect();
    let mut failed = false;
    let compared = live.first().map_or(Release::pinned().policy.name(), |l| {
        l.report.case.variant.named_policy().name()
    });
    let policies: [(&str, PlanOf); 2] = [
        (compared, |l| Some(&l.plan)),
        ("kvgeom", |l| l.plan_kvgeom.as_ref()),
    ];
    for (policy, plan_of) in policies {
        let differing = live
            .iter()
            .filter(|l| !l.report.outcome.not_reachable())
            .filter_map(|l| plan_of(l).filter(|p| !p.equal).map(|p| (l, p)));
        let (allowed, unequal): (Vec<_>, Vec<_>) =
            differing.partition(|(_, p)| p.allowed.is_some());
        if !allowed.is_empty() {
            eprintln!(
                "\n{} of {} cases: vLLM's transfers differ from kvgeom's --policy {policy} plan, each an allowed plan difference",
                allowed.len(),
                live.len()
            );
            for (l, p) in allowed.iter().take(10) {
                eprintln!(
                    "- {}: allowed ({}): {}",
                    l.report.case.label(),
                    p.allowed.as_deref().unwrap_or_default(),
                    p.first_difference.as_deref().unwrap_or("")
                );
            }
        }
        if unequal.is_empty() {
            continue;
        }
        failed |= modelled;
        eprintln!(
            "\n{} of {} cases: vLLM's transfers differ from kvgeom's --policy {policy} plan{}",
            unequal.len(),
            live.len(),
            if modelled {
                ""
            } else {
                " (information: not a release kvgeom models)"
            }
        );
        for (l, p) in unequal.iter().take(10) {
            eprintln!(
                "- {}: {}",
                l.report.case.label(),
                p.first_difference.as_deref().unwrap_or("")
            );
        }
    }
    let model_differs: Vec<&LiveReport> = live
        .iter()
        .filter(|l| l.scheduler_model.as_ref().is_some_and(|m| !m.equal))
        .collect();
    if !model_differs.is_empty() {
        failed |= modelled;
        eprintln!(
            "\n{} of {} scheduler-made cases: kvgeom's scheduler model (src/scheduler.rs) differs from vLLM's scheduler{}",
            model_differs.len(),
            live.iter().filter(|l| l.scheduler_model.is_some()).count(),
            if modelled {
                ""
            } else {
                " (information: not a release kvgeom models)"
            }
        );
        for l in model_differs.iter().take(10) {
            let m = l.scheduler_model.as_ref().map(|m| m.differences.join("; "));
            eprintln!("- {}: {}", l.report.case.label(), m.unwrap_or_default());
        }
    }
    let differing = block_differences(live);
    if !differing.is_empty() {
        failed = true;
        eprintln!(
            "\n{} geometries: the blocks vLLM derives differ from kvgeom's derivation",
            differing.len()
        );
        for (name, why) in &differing {
            eprintln!("- {name}: {why}");
        }
    }
    match expectations {
        Some(e) => failed |= !super::print_sweep_verdict(&judge_sweep(e, &reports, code)),
        None => {
            let bad: Vec<&CaseReport> = reports.iter().filter(|r| r.failed()).collect();
            if !bad.is_empty() {
                failed = true;
                eprintln!("\n{} of {} cases failed", bad.len(), reports.len());
                for r in bad.iter().take(10) {
                    eprintln!("- {}: {}", r.case.label(), r.outcome.describe());
                }
            }
        }
    }
    if let Some(code) = harness_errors(&reports) {
        return code;
    }
    if failed {
        EXIT_FAILED
    } else {
        EXIT_OK
    }
}

/// Exit 2 when any case is a harness error (the driver could not run it:
/// no verdict on vLLM), after the report with every judged case's
/// violations was written; `None` when there is none.
fn harness_errors(reports: &[CaseReport]) -> Option<u8> {
    let errors: Vec<&CaseReport> = reports
        .iter()
        .filter(|r| matches!(r.outcome, crate::scenario::Outcome::Error { .. }))
        .collect();
    if errors.is_empty() {
        return None;
    }
    eprintln!(
        "
{} of {} cases are harness errors (the driver could not run them; no verdict on vLLM):",
        errors.len(),
        reports.len()
    );
    for r in errors.iter().take(5) {
        eprintln!("- {}: {}", r.case.label(), r.outcome.describe());
    }
    Some(EXIT_BAD_INPUT)
}

/// Each checked geometry whose blocks differ from vLLM's, once, with the
/// first difference.
fn block_differences(live: &[LiveReport]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for l in live {
        let Some(b) = &l.blocks else { continue };
        let name = l.report.case.geometry_name();
        if !b.equal && !out.iter().any(|(n, _)| n == name) {
            out.push((
                name.to_string(),
                b.first_difference.clone().unwrap_or_default(),
            ));
        }
    }
    out
}

/// `P logical/kernel, D logical/kernel` of a pair's blocks.
fn blocks_text(b: &live::PairBlocks) -> String {
    let engine = |e: &live::EngineBlocks| {
        let n = |x: Option<u64>| x.map_or("?".to_string(), |x| x.to_string());
        format!(
            "{}/{} ({} bytes)",
            n(e.logical_block),
            n(e.kernel_block),
            n(e.page_bytes)
        )
    };
    format!("P {}, D {}", engine(&b.prefill), engine(&b.decode))
}

/// The line `explain` and the table print for a checked geometry.
fn blocks_line(b: &live::BlocksComparison) -> String {
    match (&b.first_difference, &b.vllm) {
        (None, Some(v)) => format!("equal: {}", blocks_text(v)),
        (Some(d), _) => format!("differ: {d}"),
        (None, None) => "not derived".to_string(),
    }
}

fn model_config_of(checks: &[live::BlockCheck]) -> String {
    checks
        .first()
        .map_or_else(String::new, |c| c.source.hf_config.display().to_string())
}

fn table(live: &[LiveReport], nixl: &crate::driver::NixlRun) -> String {
    let reports: Vec<CaseReport> = live.iter().map(|l| l.report.clone()).collect();
    let mut text = sweep_report::table(&reports);
    text.push_str(&format!("connector: vllm; bytes moved by {nixl}\n"));
    let scheduler = live
        .iter()
        .filter(|l| l.request_path == live::RequestPath::Scheduler)
        .count();
    let unreachable = live
        .iter()
        .filter(|l| l.report.outcome.not_reachable())
        .count();
    text.push_str(&format!(
        "connector: vllm; requests: {scheduler} by vLLM's scheduler ({unreachable} of them not reachable by it), {} direct\n",
        live.len() - scheduler
    ));
    let modelled: Vec<&live::SchedulerComparison> = live
        .iter()
        .filter_map(|l| l.scheduler_model.as_ref())
        .collect();
    if !modelled.is_empty() {
        text.push_str(&format!(
            "connector: vllm; kvgeom's scheduler model equal to vLLM's scheduler on {} of {} scheduler-made cases\n",
            modelled.iter().filter(|m| m.equal).count(),
            modelled.len()
        ));
    }
    let compared = live.len() - unreachable;
    let equal = live.iter().filter(|l| l.plan.equal).count();
    // Every live case carries the policy its plan is compared with.
    let reference = live.first().map_or(Release::pinned().policy.name(), |l| {
        l.report.case.variant.named_policy().name()
    });
    text.push_str(&format!(
        "connector: vllm; plan equal to kvgeom's --policy {reference} on {equal} of {compared} cases\n"
    ));
    let allowed = live.iter().filter(|l| l.plan.allowed.is_some()).count();
    if allowed > 0 {
        text.push_str(&format!(
            "connector: vllm; {allowed} of the differing plans are allowed plan differences\n"
        ));
    }
    let against_kvgeom: Vec<&PlanComparison> =
        live.iter().filter_map(|l| l.plan_kvgeom.as_ref()).collect();
    if !against_kvgeom.is_empty() {
        text.push_str(&format!(
            "connector: vllm; plan equal to kvgeom's --policy kvgeom on {} of {} cases\n",
            against_kvgeom.iter().filter(|p| p.equal).count(),
            against_kvgeom.len()
        ));
    }
    let mut shown: Vec<&str> = Vec::new();
    for l in live {
        let name = l.report.case.geometry_name();
        if let Some(b) = &l.blocks {
            if !shown.contains(&name) {
                shown.push(name);
                text.push_str(&format!(
                    "blocks of {name} vs vLLM's derivation: {}\n",
                    blocks_line(b)
                ));
            }
        }
    }
    text
}

/// The variant a live case is planned with before the interpreter is
/// probed: the pinned release's policy (set again to
/// `Interpreter::compared_policy` once the installed release is known).
pub(super) fn planned_variant() -> Variant {
    Variant::Policy(Release::pinned().policy)
}

/// The sweep's JSON report of `live` as the one sweep writes it (for
/// `kvgeom matrix`'s stored reports).
pub(super) fn json(
    live: &[LiveReport],
    shard: Option<(&Shard, &[usize])>,
    nixl: &crate::driver::NixlRun,
    code: &CodeUnderTest,
) -> String {
    let nixl = nixl_fields(nixl);
    let judged: Vec<Judged> = live
        .iter()
        .map(|l| Judged {
            report: l.report.clone(),
            extras: case_fields(l, &nixl),
        })
        .collect();
    let mut fields = nixl;
    fields.insert("connector".into(), "vllm".into());
    let reports: Vec<CaseReport> = live.iter().map(|l| l.report.clone()).collect();
    super::pipeline::json(&judged, &reports, shard, code, fields)
}

/// Move the one trace recorded into `dir` to `file`, gunzipped unless
/// `file` ends in `.gz`.
fn save_trace(
    dir: &std::path::Path,
    case: &crate::scenario::Case,
    file: &std::path::Path,
) -> std::io::Result<()> {
    use std::io::Read;
    let gz = std::fs::read(dir.join(format!("{}.gz", crate::driver::trace_file_name(case))))?;
    if file.to_string_lossy().ends_with(".gz") {
        return std::fs::write(file, gz);
    }
    let mut text = Vec::new();
    flate2::read::GzDecoder::new(&gz[..]).read_to_end(&mut text)?;
    std::fs::write(file, text)
}

/// `kvgeom explain --connector vllm`: one case on vLLM's connector, with
/// its plan comparisons, request path, scheduler model and blocks.
fn live_explain(
    args: &ExplainArgs,
    one: OneCase,
    requests: live::Requests,
) -> Result<Explained, u8> {
    let OneCase { mut case, model } = one;
    let checks: Vec<live::BlockCheck> = model
        .map(|m| live::BlockCheck {
            geometry: std::sync::Arc::clone(&case.geometry),
            source: std::sync::Arc::new(m),
        })
        .into_iter()
        .collect();
    // Compared with the pinned release until the interpreter says which
    // release it has; the memory estimate does not depend on it.
    let budget = super::max_memory_option(args.run.max_memory.as_deref())?;
    super::prepared_cases_fit(std::slice::from_ref(&case), &budget)?;
    // The case fits before the interpreter is probed (vLLM's import is slow).
    let python = driver_python(args.run.vllm_python.as_deref(), args.run.nixl)?;
    case.variant = Variant::Policy(python.compared_policy());
    let record_dir = args
        .record_trace
        .as_ref()
        .map(|_| std::env::temp_dir().join(format!("kvgeom-record-trace-{}", std::process::id())));
    let hooks = live::Hooks {
        record_traces: record_dir.clone(),
        requests,
        ..live::Hooks::default()
    };
    let ran = live::run_batch_checked(
        std::slice::from_ref(&case),
        &checks,
        &python,
        live::CASE_LIMIT,
        &hooks,
    );
    if let (Some(dir), Some(file), Ok(_)) = (&record_dir, &args.record_trace, &ran) {
        let saved = save_trace(dir, &case, file);
        let _ = std::fs::remove_dir_all(dir);
        if let Err(why) = saved {
            eprintln!("error: --record-trace {}: {why}", file.display());
            return Err(EXIT_BAD_INPUT);
        }
    }
    let live = match ran {
        Ok(mut r) if r.len() == 1 => r.remove(0),
        Ok(_) => {
            eprintln!("error: the driver returned no case");
            return Err(EXIT_BAD_INPUT);
        }
        Err(e) => {
            eprintln!("error: {e}");
            return Err(EXIT_BAD_INPUT);
        }
    };
    let differs = |d: &Option<String>| match d {
        None => "equal".to_string(),
        Some(d) => format!("differs: {d}"),
    };
    let mut out = format!(
        "{} ({} via {}, {})\noutcome: {}\nplan vs kvgeom --policy {}: {}\n",
        live.report.case.label(),
        python.code_under_test().describe(),
        python.python.display(),
        python.nixl,
        live.report.outcome.describe(),
        live.report.case.variant.named_policy().name(),
        differs(&live.plan.first_difference)
    );
    if let Some(p) = &live.plan_kvgeom {
        out.push_str(&format!(
            "plan vs kvgeom --policy kvgeom: {}\n",
            differs(&p.first_difference)
        ));
    }
    if let Some(line) = live.report.stats.redundant_writes.explain_line() {
        out.push_str(&format!("{line}\n"));
    }
    out.push_str(&format!("request path: {}\n", live.request_path.as_str()));
    if let Some(m) = &live.scheduler_model {
        out.push_str(&format!(
            "scheduler model vs vLLM's scheduler: {}\n",
            if m.equal {
                "equal".to_string()
            } else {
                format!("differs: {}", m.differences.join("; "))
            }
        ));
    }
    if let Some(b) = &live.blocks {
        out.push_str(&format!(
            "blocks vs vLLM's derivation from {}: {}\n",
            model_config_of(&checks),
            blocks_line(b)
        ));
    }
    let log = live.result.as_ref().map(live::connector_log);
    out.push_str(&super::run_lines::run_lines(
        log.as_ref(),
        live.oracle_input.as_ref(),
        &live.report.violations,
    ));
    let model_equal = live.scheduler_model.as_ref().is_none_or(|m| m.equal);
    Ok(Explained {
        text: out,
        passed: !live.report.failed()
            && live.blocks.as_ref().is_none_or(|b| b.equal)
            && model_equal,
    })
}
