//! `kvgeom sweep --connector replay TRACE...` and `kvgeom explain
//! --connector replay TRACE`: recorded v2 traces replayed as a connector
//! under test (`trace::run_trace`), judged by the one judge.

use std::path::PathBuf;

use super::pipeline::{
    expected_or_passed, refused_plan_options, Explained, Fields, Judged, OneCase,
    PipelineConnector, ShardCases, Swept,
};
use super::sweep::threads_within_limit;
use super::{ExplainArgs, SweepArgs, EXIT_BAD_INPUT};
use crate::scenario::{Case, CaseReport, MemoryKind, TransportKind};
use crate::sweep::shard::{self, Shard};
use crate::trace::run_trace::ReplayConnector;
use crate::trace::{is_v1_name, trace_inputs};
use crate::under_test::{judge, CodeUnderTest, ConnectorUnderTest, RunRecord};

/// Why an option of a run does not apply to a replayed trace, which names
/// its own case and connector.
fn refused(run: &super::RunArgs) -> Option<String> {
    if let Some(d) = &run.variant.defect {
        return Some(format!(
            "--defect {d}: defects are variants of kvgeom's connector; --connector replay replays a recorded run"
        ));
    }
    if let Some(p) = &run.variant.policy {
        return Some(format!(
            "--policy {p}: --policy selects kvgeom's connector; --connector replay replays a recorded run"
        ));
    }
    if run.transport == TransportKind::Nixl {
        return Some("--transport nixl: a replayed trace moves no bytes".into());
    }
    if let Some(m) = &run.max_memory {
        return Some(format!(
            "--max-memory {m}: a replayed trace is held to the limit on rebuilding a trace"
        ));
    }
    if let Some(python) = &run.vllm_python {
        return Some(format!(
            "--vllm-python {}: a replayed trace runs no interpreter",
            python.display()
        ));
    }
    if run.nixl.is_some() {
        return Some("--nixl: a replayed trace moves no bytes".into());
    }
    None
}

/// The options of `sweep` that a replay refuses (the cases are the traces').
fn refused_for_sweep(args: &SweepArgs) -> Option<String> {
    if let Some(why) = refused(&args.run) {
        return Some(why);
    }
    let given = [
        ("--prompts", args.prompts.is_some()),
        ("--random", args.random.is_some()),
        ("--memory vram", args.memory == MemoryKind::Vram),
        ("--compare-host", args.compare_host),
    ];
    if let Some((option, _)) = given.iter().find(|(_, given)| *given) {
        return Some(format!(
            "{option}: --connector replay runs the cases the traces recorded, as recorded"
        ));
    }
    args.record_traces.as_ref().map(|dir| {
        format!(
            "--record-traces {}: the traces are recorded already (copy them to keep them)",
            dir.display()
        )
    })
}

/// The v2 traces among `paths` (files, or folders searched recursively).
fn v2_traces(paths: &[PathBuf]) -> Result<Vec<PathBuf>, u8> {
    if paths.is_empty() {
        eprintln!("error: --connector replay: name the v2 traces (*.trace.json[.gz]) to replay");
        return Err(EXIT_BAD_INPUT);
    }
    let mut traces = Vec::new();
    for input in trace_inputs(paths) {
        match input {
            Ok(path) if is_v1_name(&path) => {
                eprintln!(
                    "error: {}: a v1 trace records no whole run; --connector replay replays v2 traces",
                    path.display()
                );
                return Err(EXIT_BAD_INPUT);
            }
            Ok(path) => traces.push(path),
            Err(e) => {
                eprintln!("error: {e}");
                return Err(EXIT_BAD_INPUT);
            }
        }
    }
    Ok(traces)
}

/// Shard `of` of the traces (sorted by path, so that every shard of one set
/// of traces agrees): the shard's traces, its record and their positions.
/// The fingerprint covers every trace's path.
fn shard_traces(
    traces: Vec<PathBuf>,
    of: Option<(u32, u32)>,
) -> (Vec<PathBuf>, Option<(Shard, Vec<usize>)>) {
    let Some((index, count)) = of else {
        return (traces, None);
    };
    let mut all = traces;
    all.sort();
    let mut parts: Vec<String> = all.iter().map(|p| p.display().to_string()).collect();
    parts.push("--connector replay".into());
    let positions = shard::positions(all.len(), index, count);
    let info = Shard {
        index,
        count,
        total_cases: all.len(),
        fingerprint: shard::fingerprint(&parts),
    };
    eprintln!(
        "shard {index}/{count}: {} of {} traces",
        positions.len(),
        all.len()
    );
    let mine = positions.iter().map(|&i| all[i].clone()).collect();
    (mine, Some((info, positions)))
}

/// Recorded v2 traces in the one sweep ([`super::pipeline`]): the cases
/// are the traces', replayed as recorded.
pub(crate) struct ReplayPipeline {
    /// This shard's traces, in the cases' order.
    traces: Vec<PathBuf>,
    /// Each trace's case label, in the same order.
    labels: Vec<String>,
    /// The traces, opened.
    connector: Option<ReplayConnector>,
    /// `--threads`, checked.
    threads: Option<usize>,
}

impl ReplayPipeline {
    /// The connector before its traces are named.
    pub(crate) fn new() -> Self {
        ReplayPipeline {
            traces: Vec::new(),
            labels: Vec::new(),
            connector: None,
            threads: None,
        }
    }
}

impl PipelineConnector for ReplayPipeline {
    fn refused(&self, args: &SweepArgs) -> Option<String> {
        refused_plan_options(args).or_else(|| refused_for_sweep(args))
    }

    fn options(&mut self, args: &SweepArgs) -> Result<(), u8> {
        self.threads = threads_within_limit(args.threads)?;
        Ok(())
    }

    /// The traces named, sharded by path, opened.
    fn cases(&mut self, args: &SweepArgs, shard_of: Option<(u32, u32)>) -> Result<ShardCases, u8> {
        let traces = v2_traces(&args.paths)?;
        super::pipeline::refuse_overwrite(args, &traces)?;
        let (traces, shard) = shard_traces(traces, shard_of);
        let connector = ReplayConnector::open(&traces).map_err(|e| {
            eprintln!("error: {e}");
            EXIT_BAD_INPUT
        })?;
        let cases = connector.cases();
        self.labels = cases.iter().map(Case::label).collect();
        self.traces = traces;
        self.connector = Some(connector);
        Ok(ShardCases { cases, shard })
    }

    /// Every traced case replayed and judged, in the traces' order.
    fn run(&mut self, _args: &SweepArgs, cases: &[Case]) -> Result<Vec<Judged>, u8> {
        let threads = self.threads;
        let Some(connector) = &self.connector else {
            return Ok(Vec::new());
        };
        let placed = connector.place(cases);
        let run = || {
            connector.run(cases, placed, &|record: RunRecord| Judged {
                report: judge(&record),
                extras: replay_fields(),
            })
        };
        match rayon::ThreadPoolBuilder::new()
            .num_threads(threads.unwrap_or(0))
            .build()
        {
            Ok(pool) => pool.install(run),
            Err(_) => run(),
        }
        .map_err(|e| {
            eprintln!("error: {e}");
            EXIT_BAD_INPUT
        })
    }

    fn code_under_test(&self, _judged: &[Judged]) -> CodeUnderTest {
        self.connector.as_ref().map_or_else(
            || CodeUnderTest::kvgeom(crate::variant::Variant::KVGEOM),
            |c| c.code_under_test(),
        )
    }

    fn report_fields(&self) -> Fields {
        replay_fields()
    }

    /// A trace is its own minimal replay: each unexpected failure's trace
    /// (a recorded run cannot be shrunk).
    fn minimal_replays(&mut self, _args: &SweepArgs, failures: &[&CaseReport]) {
        eprintln!("\nthe traces of the unexpected failures:");
        for r in failures {
            let label = r.case.label();
            let trace = self
                .labels
                .iter()
                .position(|l| *l == label)
                .and_then(|i| self.traces.get(i))
                .map_or(label, |t| t.display().to_string());
            eprintln!("- {trace}: {}", r.outcome.describe());
        }
    }

    fn refused_explain(&self, args: &ExplainArgs) -> Option<String> {
        refused_explain(args)
    }

    fn lifecycle(
        &self,
        _variant: Option<crate::lifecycle::LifecycleDefect>,
    ) -> Result<Box<dyn crate::lifecycle::ScenarioConnector>, crate::lifecycle::LifecycleError>
    {
        Err(crate::lifecycle::LifecycleError::NoLifecycle {
            reason: "a recorded trace is one request's run: it holds no scenario of several \
                     requests on shared pools",
        })
    }

    /// The traced case (not a geometry file's).
    fn explain_case(&mut self, args: &ExplainArgs) -> Result<OneCase, u8> {
        let (connector, case) = traced_case(args)?;
        self.connector = Some(connector);
        Ok(OneCase { case, model: None })
    }

    fn explain(&mut self, args: &ExplainArgs, one: OneCase) -> Result<Explained, u8> {
        let Some(connector) = &self.connector else {
            return Err(EXIT_BAD_INPUT);
        };
        replay_explain(args, connector, &one.case)
    }

    fn verdict(&mut self, sweep: &Swept<'_>) -> u8 {
        let Swept {
            expectations, code, ..
        } = *sweep;
        expected_or_passed(sweep.reports, expectations, code, "traces")
    }
}

/// `"connector": "replay"`, on the report and each case.
fn replay_fields() -> Fields {
    let mut fields = Fields::new();
    fields.insert("connector".into(), "replay".into());
    fields
}

/// Why an option of `kvgeom explain --connector replay` does not apply.
fn refused_explain(args: &ExplainArgs) -> Option<String> {
    refused(&args.run)
        .or_else(|| {
            args.svg
                .as_ref()
                .map(|_| "--svg: not available with --connector replay".into())
        })
        .or_else(|| {
            args.record_trace.as_ref().map(|f| {
                format!(
                    "--record-trace {}: the trace is recorded already",
                    f.display()
                )
            })
        })
}

/// `kvgeom explain --connector replay TRACE --prompt N ...`: the traced
/// case, whose options must be the ones given.
fn traced_case(args: &ExplainArgs) -> Result<(ReplayConnector, Case), u8> {
    let traces = match v2_traces(std::slice::from_ref(&args.geometry))? {
        t if t.len() == 1 => t,
        t => {
            eprintln!(
                "error: {}: explain replays one trace, found {}",
                args.geometry.display(),
                t.len()
            );
            return Err(EXIT_BAD_INPUT);
        }
    };
    let connector = ReplayConnector::open(&traces).map_err(|e| {
        eprintln!("error: {e}");
        EXIT_BAD_INPUT
    })?;
    let Some(traced) = connector.cases().into_iter().next() else {
        eprintln!(
            "error: {}: the trace holds no case",
            args.geometry.display()
        );
        return Err(EXIT_BAD_INPUT);
    };
    let asked = [
        (
            "--prompt",
            args.prompt.to_string(),
            traced.prompt_len.to_string(),
        ),
        (
            "--prefix-hit",
            args.prefix_hit.to_string(),
            traced.prefix_hit.to_string(),
        ),
        (
            "--mode",
            args.mode.mode().to_string(),
            traced.mode.to_string(),
        ),
        (
            "--alloc",
            args.alloc.allocation().as_str().to_string(),
            traced.allocation.as_str().to_string(),
        ),
        ("--seed", args.seed.to_string(), traced.seed.to_string()),
    ];
    if let Some((option, given, recorded)) = asked.iter().find(|(_, g, r)| g != r) {
        eprintln!(
            "error: {option} {given}: {} records {option} {recorded}",
            args.geometry.display()
        );
        return Err(EXIT_BAD_INPUT);
    }
    Ok((connector, traced))
}

/// The traced case replayed and judged, with what the recorded connector
/// did.
fn replay_explain(
    args: &ExplainArgs,
    connector: &ReplayConnector,
    case: &Case,
) -> Result<Explained, u8> {
    let cases = std::slice::from_ref(case);
    let placed = connector.place(cases);
    let explained = connector.run(cases, placed, &|record: RunRecord| {
        let report = judge(&record);
        let mut text = format!(
            "{} (replayed from {})\noutcome: {}\n",
            report.case.label(),
            args.geometry.display(),
            report.outcome.describe()
        );
        text.push_str(&super::run_lines::run_lines(
            record.connector_log().as_ref(),
            record.observed.as_ref(),
            &report.violations,
        ));
        Explained {
            text,
            passed: report.passed(),
        }
    });
    match explained {
        Ok(mut e) if e.len() == 1 => Ok(e.remove(0)),
        Ok(_) => Err(EXIT_BAD_INPUT),
        Err(e) => {
            eprintln!("error: {e}");
            Err(EXIT_BAD_INPUT)
        }
    }
}
