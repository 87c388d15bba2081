//! `kvgeom sweep --connector replay TRACE...` and `kvgeom explain
//! --connector replay TRACE`: recorded v2 traces replayed as a connector
//! under test (`trace::run_trace`), judged by the one judge.

use std::path::PathBuf;

use super::{ExplainArgs, SweepArgs, EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK};
use crate::report::sweep_report::{self, Format};
use crate::scenario::{CaseReport, MemoryKind, TransportKind};
use crate::sweep::shard::{self, Shard};
use crate::trace::run_trace::ReplayConnector;
use crate::trace::{is_v1_name, trace_inputs};
use crate::under_test::expectations::Expectations;
use crate::under_test::{judge, judge_sweep, CodeUnderTest, ConnectorUnderTest, RunRecord};

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

/// Every traced case replayed and judged, in the traces' order, on up to
/// `threads` threads.
fn replay(
    traces: &[PathBuf],
    threads: Option<usize>,
) -> Result<(Vec<CaseReport>, CodeUnderTest), u8> {
    let connector = ReplayConnector::open(traces).map_err(|e| {
        eprintln!("error: {e}");
        EXIT_BAD_INPUT
    })?;
    let cases = connector.cases();
    let placed = connector.place(&cases);
    let run = || connector.run(&cases, placed, &|record: RunRecord| judge(&record));
    let reports = match rayon::ThreadPoolBuilder::new()
        .num_threads(threads.unwrap_or(0))
        .build()
    {
        Ok(pool) => pool.install(run),
        Err(_) => run(),
    }
    .map_err(|e| {
        eprintln!("error: {e}");
        EXIT_BAD_INPUT
    })?;
    Ok((reports, connector.code_under_test()))
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

/// `kvgeom sweep --connector replay`.
pub fn replay_sweep(args: SweepArgs) -> u8 {
    if let Some(why) = refused_for_sweep(&args) {
        eprintln!("error: {why}");
        return EXIT_BAD_INPUT;
    }
    let threads = match super::sweep::threads_within_limit(args.threads) {
        Ok(t) => t,
        Err(code) => return code,
    };
    let shard_of = match args.shard.as_deref().map(shard::parse_shard).transpose() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: --shard {e}");
            return EXIT_BAD_INPUT;
        }
    };
    let expectations = match args.expect.as_deref().map(Expectations::load).transpose() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("error: --expect {e}");
            return EXIT_BAD_INPUT;
        }
    };
    let traces = match v2_traces(&args.paths) {
        Ok(t) => t,
        Err(code) => return code,
    };
    let (traces, shard) = shard_traces(traces, shard_of);
    let (reports, code) = match replay(&traces, threads) {
        Ok(r) => r,
        Err(code) => return code,
    };
    let shard = shard.as_ref().map(|(s, p)| (s, p.as_slice()));
    let text = match args.format {
        Format::Table => sweep_report::table(&reports),
        Format::Json => with_connector(sweep_report::json(&reports, shard, &code)),
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
    if let Some(expectations) = &expectations {
        let verdict = judge_sweep(expectations, &reports, &code);
        return if super::print_sweep_verdict(&verdict) {
            EXIT_OK
        } else {
            EXIT_FAILED
        };
    }
    let failures: Vec<(&PathBuf, &CaseReport)> = traces
        .iter()
        .zip(&reports)
        .filter(|(_, r)| !r.passed())
        .collect();
    if failures.is_empty() {
        return EXIT_OK;
    }
    eprintln!("\n{} of {} traces failed", failures.len(), reports.len());
    for (path, r) in failures.iter().take(10) {
        eprintln!("- {}: {}", path.display(), r.outcome.describe());
    }
    EXIT_FAILED
}

/// The sweep's JSON report with `"connector": "replay"` on it and each case.
fn with_connector(text: String) -> String {
    let Ok(mut doc) = serde_json::from_str::<serde_json::Value>(&text) else {
        return text;
    };
    doc["connector"] = "replay".into();
    if let Some(cases) = doc["cases"].as_array_mut() {
        for c in cases {
            c["connector"] = "replay".into();
        }
    }
    match serde_json::to_string_pretty(&doc) {
        Ok(pretty) => pretty + "\n",
        Err(_) => text,
    }
}

/// `kvgeom explain --connector replay TRACE --prompt N ...`: the options
/// naming the case must be the traced case's.
pub fn replay_explain(args: ExplainArgs) -> u8 {
    let refusal = refused(&args.run)
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
        });
    if let Some(why) = refusal {
        eprintln!("error: {why}");
        return EXIT_BAD_INPUT;
    }
    let traces = match v2_traces(std::slice::from_ref(&args.geometry)) {
        Ok(t) if t.len() == 1 => t,
        Ok(t) => {
            eprintln!(
                "error: {}: explain replays one trace, found {}",
                args.geometry.display(),
                t.len()
            );
            return EXIT_BAD_INPUT;
        }
        Err(code) => return code,
    };
    let connector = match ReplayConnector::open(&traces) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return EXIT_BAD_INPUT;
        }
    };
    let cases = connector.cases();
    let traced = &cases[0];
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
        return EXIT_BAD_INPUT;
    }
    let placed = connector.place(&cases);
    let explained = connector.run(&cases, placed, &|record: RunRecord| {
        let report = judge(&record);
        let mut out = format!(
            "{} (replayed from {})\noutcome: {}\n",
            report.case.label(),
            args.geometry.display(),
            report.outcome.describe()
        );
        out.push_str(&super::run_lines::run_lines(
            record.connector_log().as_ref(),
            record.observed.as_ref(),
            &report.violations,
        ));
        (out, report.passed())
    });
    match explained {
        Ok(mut e) if e.len() == 1 => {
            let (text, passed) = e.remove(0);
            out!("{text}");
            if passed {
                EXIT_OK
            } else {
                EXIT_FAILED
            }
        }
        Ok(_) => EXIT_BAD_INPUT,
        Err(e) => {
            eprintln!("error: {e}");
            EXIT_BAD_INPUT
        }
    }
}
