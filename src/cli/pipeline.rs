//! The one sweep and the one explain: `kvgeom sweep` and `kvgeom explain`
//! over any connector under test, each in one order. The sweep: the
//! options the connector refuses -> its cases (planned from geometry files
//! of its stack, or its own inputs) -> its start (memory checks,
//! interpreter probe) -> the shard -> its run, each case judged -> the
//! report (table, JSON, JUnit) -> the verdict (expectations, or every case
//! passing) -> the minimal replays of the unexpected failures, each shrunk
//! by the connector. Explain: the options the connector
//! refuses -> its one case (from a geometry file, or its own input) -> its
//! run and explanation -> exit 0 or 1.
//!
//! A connector is a [`PipelineConnector`]; [`super::connectors::build`] is
//! the only place that names them. What a connector adds to a case's JSON
//! travels with the case as [`Judged::extras`], never patched in after.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use super::sweep::{overwritten_input, SweepArgs};
use super::{default_paths, ExplainArgs, EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK};
use crate::derive::{load_geometry_file_with_source, ModelSource};
use crate::geometry::{Mode, Stack};
use crate::lifecycle::{LifecycleDefect, LifecycleError, ScenarioConnector};
use crate::report::sweep_report::{self, Format};
use crate::scenario::run::check_prefix_hit;
use crate::scenario::{Case, CaseReport};
use crate::scheduler::DecodeAllocation;
use crate::sweep::plan::{self, PlanOptions, SourcedGeometry};
use crate::sweep::shard::{parse_shard, Shard};
use crate::under_test::expectations::Expectations;
use crate::under_test::{judge_sweep, CodeUnderTest};
use crate::variant::Variant;

/// The fields of a JSON object.
pub(crate) type Fields = serde_json::Map<String, serde_json::Value>;

/// One case as the connector judged it: the report every connector gives,
/// and the fields only this connector's JSON case carries (its plan
/// comparison, its redundant writes, what moved the bytes).
pub(crate) struct Judged {
    /// The case, its outcome and violations.
    pub report: CaseReport,
    /// The connector's own fields of the case in the JSON report.
    pub extras: Fields,
}

impl Judged {
    /// A case with no connector fields.
    pub fn plain(report: CaseReport) -> Judged {
        Judged {
            report,
            extras: Fields::new(),
        }
    }
}

/// A sweep once its cases are judged, for its verdict.
pub(crate) struct Swept<'a> {
    /// Its command line.
    pub args: &'a SweepArgs,
    /// Every case's report.
    pub reports: &'a [CaseReport],
    /// What it is held to, if anything.
    pub expectations: Option<&'a Expectations>,
    /// The code that ran.
    pub code: &'a CodeUnderTest,
}

/// The cases of this shard, and the shard's record and positions among
/// every shard's cases (`None` without `--shard`).
pub(crate) struct ShardCases {
    /// The cases this run judges.
    pub cases: Vec<Case>,
    /// `--shard K/N`: which shard, and each case's position in the sweep.
    pub shard: Option<(Shard, Vec<usize>)>,
}

/// What the one sweep needs of a connector, in the sweep's order. Object
/// safe: the sweep holds a `Box<dyn PipelineConnector>`.
pub(crate) trait PipelineConnector {
    /// Why an option of this sweep does not apply to the connector.
    fn refused(&self, args: &SweepArgs) -> Option<String>;

    /// Read the connector's own options (after [`refused`](Self::refused),
    /// before any file is read).
    fn options(&mut self, _args: &SweepArgs) -> Result<(), u8> {
        Ok(())
    }

    /// The stack whose geometry files the connector runs.
    fn stack(&self) -> Stack {
        Stack::Vllm
    }

    /// The inputs when none is named.
    fn default_paths(&self) -> Result<Vec<PathBuf>, u8> {
        default_paths(Vec::new())
    }

    /// How the cases of the geometry files are planned (modes, allocations,
    /// the variant they run).
    fn plan_options(&self, args: &SweepArgs, prompts: Option<Vec<u32>>) -> Result<PlanOptions, u8> {
        Ok(PlanOptions {
            prompts,
            modes: args.mode.modes(),
            allocations: args.alloc.allocations(),
            variant: args.run.variant.variant()?,
            seed: args.seed,
        })
    }

    /// Before anything runs, with every shard's cases: memory checks, the
    /// interpreter found; the cases as they will run (a connector may set
    /// their variant once it knows the code under test). `sources` are the
    /// geometry files the cases were planned from.
    fn start(
        &mut self,
        _args: &SweepArgs,
        _sources: &[SourcedGeometry],
        cases: Vec<Case>,
    ) -> Result<Vec<Case>, u8> {
        Ok(cases)
    }

    /// What must be equal for two shards' reports to merge (besides the
    /// cases): the run options that change a case's result.
    fn shard_key(&self, args: &SweepArgs) -> String {
        format!("{:?}", args.random)
    }

    /// This run's cases: by default planned from the geometry files of the
    /// connector's stack, then sharded.
    fn cases(&mut self, args: &SweepArgs, shard_of: Option<(u32, u32)>) -> Result<ShardCases, u8> {
        geometry_cases(self, args, shard_of)
    }

    /// Run and judge `cases`, in their order; `Err` is the exit status once
    /// the harness error is printed.
    fn run(&mut self, args: &SweepArgs, cases: &[Case]) -> Result<Vec<Judged>, u8>;

    /// Its lifecycle half (`kvgeom lifecycle`): the connector running
    /// batches of requests that share the engines' pools, with `variant`
    /// (one of kvgeom's lifecycle defect variants) if given; or why it runs
    /// none, which the command prints before anything is read.
    fn lifecycle(
        &self,
        _variant: Option<LifecycleDefect>,
    ) -> Result<Box<dyn ScenarioConnector>, LifecycleError> {
        Err(LifecycleError::NoLifecycle {
            reason: "its driver runs one request per case: several requests at once on shared \
                     pools (aborts, completions landing late, leases) are run on kvgeom's \
                     connector only",
        })
    }

    /// The code that ran (after [`run`](Self::run)).
    fn code_under_test(&self, judged: &[Judged]) -> CodeUnderTest;

    /// The expectations this sweep is held to: `given` (`--expect`), or
    /// the connector's own for the code that ran.
    fn expectations(
        &mut self,
        given: Option<Expectations>,
        _code: &CodeUnderTest,
    ) -> Result<Option<Expectations>, u8> {
        Ok(given)
    }

    /// The terminal table of the judged cases and their `reports`.
    fn table(&self, _judged: &[Judged], reports: &[CaseReport]) -> String {
        sweep_report::table(reports)
    }

    /// The connector's own fields of the JSON report (beside its cases).
    fn report_fields(&self) -> Fields {
        Fields::new()
    }

    /// The exit status, with what explains it on stderr: the expectations
    /// (or every case passing) and the minimal replays of the failures.
    fn verdict(&mut self, sweep: &Swept<'_>) -> u8;

    /// Run candidate cases of a shrink, judged, recording and printing
    /// nothing; `None` when they could not run (the reason printed as a
    /// note). By default a connector cannot (a replayed trace).
    fn run_candidates(&mut self, _cases: &[Case]) -> Option<Vec<CaseReport>> {
        None
    }

    /// Each failure shrunk to the smallest case that fails the same way
    /// (the smallest prompt length, then no prefix hit): by default every
    /// candidate of every failure judged in one batch
    /// (`sweep::batch_shrink`), a connector that starts an interpreter per
    /// batch paying for two.
    fn shrink(&mut self, failures: &[&CaseReport]) -> Vec<Case> {
        let as_run = || failures.iter().map(|r| r.case.clone()).collect();
        let shrunk = crate::sweep::batch_shrink::shrink_batched(failures, |cases| {
            self.run_candidates(cases).ok_or(())
        });
        shrunk.unwrap_or_else(|()| as_run())
    }

    /// The command that replays a case on this connector (with the
    /// interpreter that ran it and what moved its bytes, for a driven one).
    fn replay_command(&self, case: &Case) -> String {
        case.replay_command()
    }

    /// Print how to replay each unexpected failure (`failures`: the first
    /// of each geometry, mode and outcome): by default `minimal replays:`,
    /// each shrunk unless `--no-shrink`, with its `kvgeom explain` command.
    fn minimal_replays(&mut self, args: &SweepArgs, failures: &[&CaseReport]) {
        let minimal: Vec<Case> = if args.no_shrink {
            failures.iter().map(|r| r.case.clone()).collect()
        } else {
            self.shrink(failures)
        };
        eprintln!("\nminimal replays:");
        for (r, m) in failures.iter().zip(&minimal) {
            eprintln!("- {}: {}", r.case.label(), r.outcome.describe());
            for v in r.violations.iter().take(3) {
                eprintln!("    {v}");
            }
            eprintln!("  replay: {}", self.replay_command(m));
        }
    }

    /// Why an option of `explain` does not apply to the connector.
    fn refused_explain(&self, args: &ExplainArgs) -> Option<String>;

    /// Read the connector's own options of `explain` (after
    /// [`refused_explain`](Self::refused_explain)).
    fn explain_options(&mut self, _args: &ExplainArgs) -> Result<(), u8> {
        Ok(())
    }

    /// How `explain`'s one case runs: its mode, allocation and variant.
    fn one_case(&self, args: &ExplainArgs) -> Result<(Mode, DecodeAllocation, Variant), u8> {
        Ok((
            args.mode.mode(),
            args.alloc.allocation(),
            args.run.variant.variant()?,
        ))
    }

    /// The case `explain` runs: by default the one its geometry file and
    /// options name.
    fn explain_case(&mut self, args: &ExplainArgs) -> Result<OneCase, u8> {
        geometry_case(self, args)
    }

    /// Run the case and say what it did (files `explain` writes, such as
    /// `--svg` and `--record-trace`, written); `Err` is the exit status
    /// once the reason is printed.
    fn explain(&mut self, args: &ExplainArgs, one: OneCase) -> Result<Explained, u8>;
}

/// `kvgeom sweep` over `connector`.
pub(crate) fn sweep(mut connector: Box<dyn PipelineConnector>, args: SweepArgs) -> u8 {
    if let Some(why) = connector.refused(&args) {
        eprintln!("error: {why}");
        return EXIT_BAD_INPUT;
    }
    if let Err(code) = connector.options(&args) {
        return code;
    }
    let shard_of = match args.shard.as_deref().map(parse_shard).transpose() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: --shard {e}");
            return EXIT_BAD_INPUT;
        }
    };
    let given = match args.expect.as_deref().map(Expectations::load).transpose() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("error: {e}");
            return EXIT_BAD_INPUT;
        }
    };
    let ShardCases { cases, shard } = match connector.cases(&args, shard_of) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let judged = match connector.run(&args, &cases) {
        Ok(j) => j,
        Err(code) => return code,
    };
    let code = connector.code_under_test(&judged);
    let expectations = match connector.expectations(given, &code) {
        Ok(e) => e,
        Err(code) => return code,
    };
    let reports = reports_of(&judged);
    let shard = shard.as_ref().map(|(s, p)| (s, p.as_slice()));
    let text = match args.format {
        Format::Table => connector.table(&judged, &reports),
        Format::Json => json(&judged, &reports, shard, &code, connector.report_fields()),
        Format::Junit => sweep_report::junit(&reports, shard, &code),
    };
    match &args.out {
        Some(path) => {
            if let Err(code) = super::write_output("--out", path, &text) {
                return code;
            }
        }
        None => out!("{text}"),
    }
    let swept = Swept {
        args: &args,
        reports: &reports,
        expectations: expectations.as_ref(),
        code: &code,
    };
    let exit = connector.verdict(&swept);
    let failures = unexpected_failures(&reports, swept.expectations);
    if !failures.is_empty() {
        connector.minimal_replays(&args, &failures);
    }
    exit
}

/// `kvgeom explain` over `connector`: one case, what it did, exit 0 when
/// it passed and 1 when it failed.
pub(crate) fn explain(mut connector: Box<dyn PipelineConnector>, args: ExplainArgs) -> u8 {
    if let Some(why) = connector.refused_explain(&args) {
        eprintln!("error: {why}");
        return EXIT_BAD_INPUT;
    }
    if let Err(code) = connector.explain_options(&args) {
        return code;
    }
    let one = match connector.explain_case(&args) {
        Ok(c) => c,
        Err(code) => return code,
    };
    match connector.explain(&args, one) {
        Ok(Explained { text, passed }) => {
            out!("{text}");
            if passed {
                EXIT_OK
            } else {
                EXIT_FAILED
            }
        }
        Err(code) => code,
    }
}

/// `explain`'s one case, and the deployment its file states when it
/// names `model.hf_config`.
pub(crate) struct OneCase {
    /// The case.
    pub case: Case,
    /// The model config and engine options of a derived file.
    pub model: Option<ModelSource>,
}

/// What `explain` prints, and whether the case passed (the exit status).
pub(crate) struct Explained {
    /// The explanation.
    pub text: String,
    /// The case passed (and whatever else the connector compares agreed).
    pub passed: bool,
}

/// The case of `explain`'s geometry file and options, on a geometry of the
/// connector's stack.
fn geometry_case<C: PipelineConnector + ?Sized>(
    connector: &mut C,
    args: &ExplainArgs,
) -> Result<OneCase, u8> {
    let (mode, allocation, variant) = connector.one_case(args)?;
    let (geometry, model) = load_geometry_file_with_source(&args.geometry).map_err(|e| {
        eprintln!("error: {e}");
        EXIT_BAD_INPUT
    })?;
    match connector.stack() {
        Stack::Vllm => super::refuse_other_stack(&geometry, &args.geometry)?,
        Stack::Sglang if geometry.stack != Stack::Sglang => {
            eprintln!(
                "error: {}: a vLLM-stack geometry; --connector sglang runs SGLang's pools (stack = \"sglang\")",
                args.geometry.display()
            );
            return Err(EXIT_BAD_INPUT);
        }
        Stack::Sglang => {}
    }
    super::prompt_option(args.prompt)?;
    if let Err(why) = check_prefix_hit(&geometry, args.prompt, args.prefix_hit) {
        let hit = args.prefix_hit;
        let why = why.to_string();
        let rule = why
            .strip_prefix(&format!("prefix hit {hit}: "))
            .unwrap_or(&why);
        eprintln!(
            "error: --prefix-hit {hit}: {}: {rule}",
            args.geometry.display()
        );
        return Err(EXIT_BAD_INPUT);
    }
    let case = Case {
        geometry: Arc::new(geometry),
        file: Some(args.geometry.clone()),
        prompt_len: args.prompt,
        prefix_hit: args.prefix_hit,
        mode,
        allocation,
        seed: args.seed,
        variant,
    };
    Ok(OneCase { case, model })
}

/// How many failures a sweep replays at most (the first of each geometry,
/// mode and outcome).
const REPLAYED_AT_MOST: usize = 5;

/// The failures the expectations do not cover (every failure without
/// them), the first of each geometry, mode and outcome, at most
/// [`REPLAYED_AT_MOST`].
fn unexpected_failures<'a>(
    reports: &'a [CaseReport],
    expectations: Option<&Expectations>,
) -> Vec<&'a CaseReport> {
    let mut shown: Vec<(&str, Mode, &str)> = Vec::new();
    let mut out = Vec::new();
    for r in reports {
        let expected = expectations.is_some_and(|e| !e.covering(&r.case).is_empty());
        if !r.failed() || expected {
            continue;
        }
        let key = (r.case.geometry_name(), r.case.mode, r.outcome.label());
        if shown.contains(&key) || shown.len() >= REPLAYED_AT_MOST {
            continue;
        }
        shown.push(key);
        out.push(r);
    }
    out
}

/// The reports of `judged`.
pub(crate) fn reports_of(judged: &[Judged]) -> Vec<CaseReport> {
    judged.iter().map(|j| j.report.clone()).collect()
}

/// The JSON report: the sweep's, with the connector's report fields and
/// each case's extras. Without any, exactly [`sweep_report::json`].
pub(super) fn json(
    judged: &[Judged],
    reports: &[CaseReport],
    shard: Option<(&Shard, &[usize])>,
    code: &CodeUnderTest,
    fields: Fields,
) -> String {
    let text = sweep_report::json(reports, shard, code);
    if fields.is_empty() && judged.iter().all(|j| j.extras.is_empty()) {
        return text;
    }
    let Ok(mut doc) = serde_json::from_str::<serde_json::Value>(&text) else {
        return text;
    };
    if let Some(top) = doc.as_object_mut() {
        top.extend(fields);
    }
    if let Some(cases) = doc["cases"].as_array_mut() {
        for (case, j) in cases.iter_mut().zip(judged) {
            if let Some(obj) = case.as_object_mut() {
                obj.extend(j.extras.clone());
            }
        }
    }
    match serde_json::to_string_pretty(&doc) {
        Ok(pretty) => pretty + "\n",
        Err(_) => text,
    }
}

/// The cases of the geometry files of the connector's stack, planned as
/// the connector says, started, then sharded.
fn geometry_cases<C: PipelineConnector + ?Sized>(
    connector: &mut C,
    args: &SweepArgs,
    shard_of: Option<(u32, u32)>,
) -> Result<ShardCases, u8> {
    let prompts = super::prompts_option(args.prompts.as_deref())?;
    super::random_option(args.random)?;
    let paths = if args.paths.is_empty() {
        connector.default_paths()?
    } else {
        args.paths.clone()
    };
    refuse_overwrite(args, &paths)?;
    let sources = plan::load_sources(&paths)
        .map_err(|e| {
            eprintln!("error: {e}");
            EXIT_BAD_INPUT
        })
        .and_then(|s| of_stack(s, connector.stack()))?;
    for s in &sources {
        let file = s
            .file
            .as_ref()
            .map_or_else(|| s.geometry.name.clone(), |f| f.display().to_string());
        if let Err(e) =
            crate::sweep::prompts::check_default_sweep(&file, &s.geometry, prompts.is_some())
        {
            eprintln!("error: {e}");
            return Err(EXIT_BAD_INPUT);
        }
    }
    let opts = connector.plan_options(args, prompts)?;
    let all_cases = match args.random {
        Some(n) => plan::random(&sources, n, args.seed, &opts),
        None => plan::grid(&sources, &opts),
    };
    let all_cases = connector.start(args, &sources, all_cases)?;
    let key = connector.shard_key(args);
    let (cases, shard) = super::shard_cases(all_cases, shard_of, &sources, &opts, &key);
    Ok(ShardCases { cases, shard })
}

/// The geometries of `sources` on `stack`. Files of the other stack are
/// skipped with one summary line on stderr, so that a folder may hold
/// both; when every file named is of the other stack nothing would be
/// judged, and that is exit 2 rather than a sweep of no cases.
pub(crate) fn of_stack(
    sources: Vec<SourcedGeometry>,
    stack: Stack,
) -> Result<Vec<SourcedGeometry>, u8> {
    let (ours, others): (Vec<_>, Vec<_>) =
        sources.into_iter().partition(|s| s.geometry.stack == stack);
    if others.is_empty() {
        return Ok(ours);
    }
    match stack {
        Stack::Vllm => {
            let why = "kvgeom's and vLLM's connectors run vLLM's KV cache, not SGLang's pools";
            if ours.is_empty() {
                eprintln!(
                    "error: every geometry named is SGLang's ({} with stack = \"sglang\"): {why}",
                    others.len()
                );
                return Err(EXIT_BAD_INPUT);
            }
            eprintln!(
                "note: {} SGLang geometries skipped (stack = \"sglang\"): {why}",
                others.len()
            );
        }
        Stack::Sglang => {
            let why = "--connector sglang runs SGLang's pools, not vLLM's KV cache";
            if ours.is_empty() {
                eprintln!(
                    "error: no SGLang geometry (stack = \"sglang\") among those named ({} of vLLM's stack): {why}",
                    others.len()
                );
                return Err(EXIT_BAD_INPUT);
            }
            eprintln!(
                "note: {} vLLM-stack geometries skipped: {why}",
                others.len()
            );
        }
    }
    Ok(ours)
}

/// Exit 2 when `--out` names an input of the sweep: a geometry file or
/// trace among `paths` (or in a folder of them), or the expectations file.
pub(crate) fn refuse_overwrite(args: &SweepArgs, paths: &[PathBuf]) -> Result<(), u8> {
    let Some(out) = &args.out else {
        return Ok(());
    };
    let Some(input) = overwritten_input(out, paths, args.expect.as_deref()) else {
        return Ok(());
    };
    // The input is named when --out names it another way.
    let which = if input == *out {
        String::new()
    } else {
        format!(" ({})", input.display())
    };
    eprintln!(
        "error: --out {}: that is an input of this sweep{which}; write the report elsewhere",
        out.display()
    );
    Err(EXIT_BAD_INPUT)
}

/// Why `--plan-differences` or `--compare-policy` is refused by a
/// connector other than vLLM's.
pub(crate) fn refused_plan_options(args: &SweepArgs) -> Option<String> {
    [
        (args.plan_differences.is_some(), "--plan-differences"),
        (args.compare_policy.is_some(), "--compare-policy"),
    ]
    .into_iter()
    .find(|(given, _)| *given)
    .map(|(_, option)| {
        format!("{option}: applies to the plans of vLLM's connector; add --connector vllm")
    })
}

/// `nixl` (and `nixl_version` for real NIXL): what moved a driven
/// connector's bytes, on its JSON report and each case.
pub(crate) fn nixl_fields(nixl: &crate::driver::NixlRun) -> Fields {
    let mut fields = Fields::new();
    fields.insert("nixl".into(), nixl.as_str().into());
    if let Some(version) = nixl.version() {
        fields.insert("nixl_version".into(), version.into());
    }
    fields
}

/// What moves a driven connector's bytes (`--nixl`), resolved for its
/// interpreter by the driver's own probe; the note of `--nixl auto` falling
/// back to the stand-in printed. `Err` is exit 2, the reason printed.
pub(crate) fn resolve_nixl(
    driver: &'static crate::driver::DriverKind,
    python: &std::path::Path,
    driver_dir: &std::path::Path,
    nixl: Option<super::NixlArg>,
) -> Result<crate::driver::NixlRun, u8> {
    let resolved = crate::driver::resolve(
        driver,
        python,
        driver_dir,
        nixl.unwrap_or_default().choice(),
    )
    .map_err(|e| {
        eprintln!("error: {e}");
        EXIT_BAD_INPUT
    })?;
    if let Some(why) = &resolved.note {
        eprintln!("note: --nixl auto: real NIXL does not run here ({why}); the driver's stand-in moves the bytes");
    }
    Ok(resolved.run)
}

/// Exit status of a sweep held to `expectations` (printed), or, without
/// them, of every case passing (how many of the `what` failed printed).
pub(crate) fn expected_or_passed(
    reports: &[CaseReport],
    expectations: Option<&Expectations>,
    code: &CodeUnderTest,
    what: &str,
) -> u8 {
    let as_expected = match expectations {
        Some(e) => super::print_sweep_verdict(&judge_sweep(e, reports, code)),
        None => {
            let failed = reports.iter().filter(|r| !r.passed()).count();
            if failed > 0 {
                eprintln!("\n{failed} of {} {what} failed", reports.len());
            }
            failed == 0
        }
    };
    if as_expected {
        EXIT_OK
    } else {
        EXIT_FAILED
    }
}

/// How long the run took, with the code that ran: the line a live sweep
/// prints on stderr once its cases are judged.
pub(crate) fn ran_line(
    code: &CodeUnderTest,
    interpreter: &std::path::Path,
    bytes: &str,
    cases: usize,
    started: Instant,
) {
    eprintln!(
        "{} ({}), {}: {} cases in {:.1} s",
        code.describe(),
        interpreter.display(),
        bytes,
        cases,
        started.elapsed().as_secs_f64()
    );
}
