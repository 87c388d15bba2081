//! `kvgeom check-trace` and `kvgeom diff-trace`: one verdict per trace file,
//! printed as text or as the JSON report `kvgeom-trace-verdicts/1`
//! (docs/report-format.md).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::{VariantArgs, EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK};
use crate::sglang::trace_file::{is_sglang_trace, read_json, SglangTrace};
use crate::trace::check::{check_case, skipped_names, SkippedCheck};
use crate::trace::run_trace::{
    check_recorded, diff_recorded, explain_recorded, RecordedCase, RecordedCheck,
};
use crate::trace::{
    diff_against_connector, explain_difference, is_v1_name, registration_is_modelled, trace_inputs,
    TraceCase,
};
use crate::under_test::Release;
use crate::variant::Variant;

/// The `schema` of the JSON verdict report.
pub const TRACE_VERDICTS_SCHEMA: &str = "kvgeom-trace-verdicts/1";

/// How `check-trace` and `diff-trace` print their verdicts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum TraceFormat {
    /// One line per file and a summary line.
    #[default]
    Text,
    /// The JSON report (schema `kvgeom-trace-verdicts/1`).
    Json,
}

/// The command line of `kvgeom check-trace`.
#[derive(Clone, Debug, clap::Args)]
pub struct CheckTraceArgs {
    /// Trace files (`.jsonl`, `.jsonl.gz`) or folders, searched recursively.
    pub files: Vec<PathBuf>,
    /// `text` (one line per file) or `json` (schema `kvgeom-trace-verdicts/1`).
    #[arg(long, value_enum, default_value = "text")]
    pub format: TraceFormat,
    /// Memory rebuilding one traced case may take (e.g. 1.5G; default:
    /// half of the memory available, within an address-space limit, and
    /// at most 4 GiB).
    #[arg(long, value_name = "SIZE")]
    pub max_memory: Option<String>,
}

/// The command line of `kvgeom diff-trace`.
#[derive(Clone, Debug, clap::Args)]
pub struct DiffTraceArgs {
    /// Trace files (`.jsonl`, `.jsonl.gz`) or folders, searched recursively.
    pub files: Vec<PathBuf>,
    #[command(flatten)]
    pub variant: VariantArgs,
    /// `text` (one line per file) or `json` (schema `kvgeom-trace-verdicts/1`).
    #[arg(long, value_enum, default_value = "text")]
    pub format: TraceFormat,
    /// Memory rebuilding one traced case may take (e.g. 1.5G; default:
    /// half of the memory available, within an address-space limit, and
    /// at most 4 GiB).
    #[arg(long, value_name = "SIZE")]
    pub max_memory: Option<String>,
}

/// What became of one trace file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
enum Verdict {
    /// check-trace: no oracle is violated.
    Passed,
    /// check-trace: some oracle is violated.
    Violations,
    /// check-trace: vLLM refused the trace's handshake; nothing to check.
    Rejected,
    /// diff-trace: kvgeom's connector did what vLLM did.
    Match,
    /// diff-trace: it did not.
    Differ,
    /// The file could not be read, understood or judged.
    Error,
}

impl Verdict {
    fn exit(self) -> u8 {
        match self {
            Verdict::Passed | Verdict::Rejected | Verdict::Match => EXIT_OK,
            Verdict::Violations | Verdict::Differ => EXIT_FAILED,
            Verdict::Error => EXIT_BAD_INPUT,
        }
    }
}

/// One file's verdict, as the JSON report lists it.
#[derive(Clone, Debug, Serialize)]
struct FileVerdict {
    file: String,
    verdict: Verdict,
    message: String,
    /// diff-trace under kvgeom's policy: the known defects (names joined by
    /// `+`) that reproduce a differing trace exactly; null otherwise.
    explained_by: Option<String>,
    /// check-trace: the checks it could not run on this trace, by name.
    skipped_checks: Vec<&'static str>,
}

/// What `judge_all`'s judge says about one trace.
struct Judged {
    verdict: Verdict,
    /// The verdict in words (the report's `message`).
    message: String,
    /// What the text format prints for the file.
    lines: Vec<String>,
    /// The report's `explained_by`.
    explained_by: Option<String>,
    /// The checks not run on the trace.
    skipped: Vec<SkippedCheck>,
}

impl Judged {
    fn new(verdict: Verdict, message: String, lines: Vec<String>) -> Judged {
        Judged {
            verdict,
            message,
            lines,
            explained_by: None,
            skipped: Vec::new(),
        }
    }

    fn error(message: String) -> Judged {
        Judged::new(Verdict::Error, message, Vec::new())
    }
}

#[derive(Clone, Debug, Default, Serialize)]
struct Summary {
    files: usize,
    passed: usize,
    failed: usize,
    rejected: usize,
    error: usize,
    /// Verdicts `differ` that known defects explain.
    explained: usize,
    /// Verdicts of traces on which some check was skipped.
    skipped_checks: usize,
    /// Every check skipped on some trace, in [`SkippedCheck::ALL`] order.
    #[serde(skip)]
    skipped: Vec<SkippedCheck>,
}

#[derive(Serialize)]
struct Report<'a> {
    schema: &'static str,
    summary: Summary,
    files: &'a [FileVerdict],
}

/// Exit status over several files: bad input wins, then failures.
fn worst(a: u8, b: u8) -> u8 {
    if a == EXIT_BAD_INPUT || b == EXIT_BAD_INPUT {
        EXIT_BAD_INPUT
    } else {
        a.max(b)
    }
}

/// The text of a caught panic.
fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

/// A trace read: v1 (vLLM's unit-test traces) or v2 (the live driver's).
enum Loaded {
    V1(Box<TraceCase>),
    V2(Box<RecordedCase>),
    /// A v3 trace of SGLang's connector (`crate::sglang::trace_file`).
    Sglang(Box<SglangTrace>),
}

/// Why a trace could not be read, in either version.
#[derive(Debug, thiserror::Error)]
enum LoadError {
    #[error(transparent)]
    V1(#[from] crate::trace::TraceError),
    #[error(transparent)]
    V2(#[from] crate::trace::run_trace::RecordedError),
    #[error(transparent)]
    Sglang(#[from] crate::sglang::trace_file::SglangTraceError),
}

/// Read a trace by its name: `*.jsonl` and `*.jsonl.gz` are v1, any other
/// file v2 or v3 (SGLang's v3 traces apart). The error names the file (and
/// line).
fn load(path: &Path) -> Result<Loaded, LoadError> {
    if is_v1_name(path) {
        return Ok(Loaded::V1(Box::new(TraceCase::read(path)?)));
    }
    // A file that is not JSON is left to the v2 reader's errors.
    if let Ok(value) = read_json(path) {
        if is_sglang_trace(&value) {
            return Ok(Loaded::Sglang(Box::new(SglangTrace::parse(path, value)?)));
        }
    }
    Ok(Loaded::V2(Box::new(RecordedCase::read(path)?)))
}

/// Read every trace of `files` (folders searched recursively) and judge
/// each with `judge`. A file that cannot be read, or whose judging
/// fails (even by a panic), is an `error` verdict; the other files are still
/// judged. Prints the verdicts in `format` and returns the exit status.
fn judge_all(
    files: &[PathBuf],
    format: TraceFormat,
    summary_line: impl Fn(&Summary) -> String,
    judge: impl Fn(&Path, &Loaded) -> Judged,
) -> u8 {
    if files.is_empty() {
        eprintln!(
            "error: no trace given: name trace files (.jsonl, .jsonl.gz, .trace.json, .trace.json.gz), or folders of them"
        );
        return EXIT_BAD_INPUT;
    }
    let text = format == TraceFormat::Text;
    let mut verdicts = Vec::new();
    let mut summary = Summary::default();
    let mut code = EXIT_OK;
    for input in trace_inputs(files) {
        let (file, judged) = match input {
            Err(e) => (e.path.clone(), Judged::error(e.to_string())),
            Ok(f) => {
                let judged = catch_unwind(AssertUnwindSafe(|| match load(&f) {
                    Ok(case) => judge(&f, &case),
                    // The error names the file (and line) already.
                    Err(e) => Judged::error(e.to_string()),
                }));
                let judged = judged.unwrap_or_else(|p| {
                    Judged::error(format!(
                        "{}: internal error (please report it): {}",
                        f.display(),
                        panic_text(&*p)
                    ))
                });
                if text && judged.verdict != Verdict::Error {
                    for line in &judged.lines {
                        outln!("{line}");
                    }
                }
                (f, judged)
            }
        };
        let Judged {
            verdict,
            message,
            explained_by,
            skipped,
            ..
        } = judged;
        if text && verdict == Verdict::Error {
            eprintln!("error: {message}");
        }
        summary.files += 1;
        match verdict {
            Verdict::Passed | Verdict::Match => summary.passed += 1,
            Verdict::Violations | Verdict::Differ => summary.failed += 1,
            Verdict::Rejected => summary.rejected += 1,
            Verdict::Error => summary.error += 1,
        }
        summary.explained += usize::from(explained_by.is_some());
        summary.skipped_checks += usize::from(!skipped.is_empty());
        summary.skipped = SkippedCheck::ALL
            .into_iter()
            .filter(|c| summary.skipped.contains(c) || skipped.contains(c))
            .collect();
        code = worst(code, verdict.exit());
        verdicts.push(FileVerdict {
            file: file.display().to_string(),
            verdict,
            message,
            explained_by,
            skipped_checks: skipped.iter().map(|c| c.name()).collect(),
        });
    }
    if text {
        if code != EXIT_BAD_INPUT || summary.files > summary.error {
            outln!("\n{}", summary_line(&summary));
        }
    } else {
        let report = Report {
            schema: TRACE_VERDICTS_SCHEMA,
            summary,
            files: &verdicts,
        };
        match serde_json::to_string_pretty(&report) {
            Ok(json) => outln!("{json}"),
            Err(e) => {
                eprintln!("error: cannot write the JSON report: {e}");
                return EXIT_BAD_INPUT;
            }
        }
    }
    code
}

/// Rebuild each trace with kvgeom's connector under the chosen variant and
/// compare lists, transfers and rewritten ids with what vLLM did. Under
/// kvgeom's own policy, a differing trace is rebuilt again with the known
/// defects to name those that reproduce it ([`explain_difference`]); under
/// any other variant nothing is sought, since that variant is already the
/// reproduction being judged.
pub fn diff_trace(args: &DiffTraceArgs) -> u8 {
    if let Err(code) = super::memory_option(args.max_memory.as_deref()) {
        return code;
    }
    let (files, format) = (&args.files, args.format);
    let variant = match args.variant.variant() {
        Ok(v) => v,
        Err(code) => return code,
    };
    let policy = variant.policy();
    let explain = variant == Variant::KVGEOM;
    judge_all(
        files,
        format,
        |s| {
            let mut line = format!("{} match, {} differ", s.passed, s.failed);
            if explain && s.failed > 0 {
                line.push_str(&format!(" ({} explained by known defects)", s.explained));
            }
            line
        },
        |f, loaded| match loaded {
            Loaded::V1(case) => diff_v1(f, case, policy, explain),
            Loaded::V2(case) => diff_v2(f, case, variant, explain),
            Loaded::Sglang(_) => Judged::error(format!(
                "{}: an SGLang trace: diff-trace rebuilds a case with kvgeom's connector, which \
                 has no model of SGLang's pools to compare with; check-trace judges it",
                f.display()
            )),
        },
    )
}

fn diff_v2(f: &Path, case: &RecordedCase, variant: Variant, explain: bool) -> Judged {
    match diff_recorded(case, variant) {
        Ok(d) => match d.difference {
            None => Judged::new(
                Verdict::Match,
                "MATCH".into(),
                vec![format!("{}: MATCH", f.display())],
            ),
            Some(difference) => {
                let mut message = format!("DIFFER: {difference}");
                if Release::of_vllm(&case.vllm_version).is_none() {
                    // No policy models the traced release: nothing to hold it to.
                    message.push_str(&format!(
                        " (vLLM {} is not a release kvgeom models: the comparison is information)",
                        case.vllm_version
                    ));
                }
                let mut lines = vec![format!("{}: {message}", f.display())];
                let mut judged = Judged::new(Verdict::Differ, message, Vec::new());
                if explain {
                    let explanation = explain_recorded(case);
                    lines.push(format!("  differs; {explanation}"));
                    judged.explained_by = explanation.names();
                }
                judged.lines = lines;
                judged
            }
        },
        Err(e) => Judged::error(e.to_string()),
    }
}

fn diff_v1(f: &Path, case: &TraceCase, policy: crate::connector::Policy, explain: bool) -> Judged {
    if let Err(e) = registration_is_modelled(case) {
        return Judged::error(format!("{}: {e}", f.display()));
    }
    match diff_against_connector(case, policy) {
        Ok(report) if report.is_match() => Judged::new(
            Verdict::Match,
            "MATCH".into(),
            vec![format!("{}: MATCH", f.display())],
        ),
        Ok(report) => {
            let mut lines = vec![format!("{}: {report}", f.display())];
            let mut judged = Judged::new(Verdict::Differ, report.to_string(), Vec::new());
            if explain {
                let explanation = explain_difference(case);
                lines.push(format!("  differs; {explanation}"));
                judged.explained_by = explanation.names();
            }
            judged.lines = lines;
            judged
        }
        Err(e) => Judged::error(format!("{}: {e}", f.display())),
    }
}

/// Run the oracles on each trace's own transfers: descriptor level, and
/// byte level on a v2 trace that holds memory images.
pub fn check_trace(args: &CheckTraceArgs) -> u8 {
    if let Err(code) = super::memory_option(args.max_memory.as_deref()) {
        return code;
    }
    let (files, format) = (&args.files, args.format);
    judge_all(
        files,
        format,
        |s| {
            let mut line = format!("{} passed, {} failed", s.passed, s.failed);
            if s.rejected > 0 {
                line.push_str(&format!(", {} rejected", s.rejected));
            }
            if s.skipped_checks > 0 {
                line.push_str(&format!(
                    "; {} with checks skipped (a prefill page too small for what it advertises): {}",
                    s.skipped_checks,
                    skipped_names(&s.skipped)
                ));
            }
            line
        },
        |f, loaded| match loaded {
            Loaded::V1(case) => check_v1(f, case),
            Loaded::V2(case) => check_v2(f, case),
            Loaded::Sglang(trace) => check_sglang(f, trace),
        },
    )
}

fn check_v2(f: &Path, case: &RecordedCase) -> Judged {
    match check_recorded(case) {
        Ok(RecordedCheck::Passed { bytes_checked }) => {
            let message = if bytes_checked {
                "OK (descriptor and byte level)"
            } else {
                "OK (descriptor level: the trace holds no memory images)"
            };
            Judged::new(
                Verdict::Passed,
                message.into(),
                vec![format!("{}: {message}", f.display())],
            )
        }
        Ok(RecordedCheck::Rejected { message, expected }) => {
            let message = format!(
                "vLLM refused the handshake{}: {message}",
                if expected {
                    " as the geometry expects"
                } else {
                    " (the geometry expects the pair to work)"
                }
            );
            let line = format!("{}: REJECTED: {message}", f.display());
            Judged::new(Verdict::Rejected, message, vec![line])
        }
        Ok(RecordedCheck::Failed { findings }) => {
            let mut message = format!("{} violations", findings.len());
            let mut lines = vec![format!("{}: {message}", f.display())];
            for x in findings.iter().take(10) {
                lines.push(format!("  {x}"));
                message.push_str(&format!("; {x}"));
            }
            Judged::new(Verdict::Violations, message, lines)
        }
        Err(e) => Judged::error(e.to_string()),
    }
}

/// An SGLang trace: the verdict the sweep gave, from the recorded result
/// and memory.
fn check_sglang(f: &Path, trace: &SglangTrace) -> Judged {
    use crate::scenario::Outcome;
    let judged = crate::sglang::run::judge_trace(trace);
    let r = &judged.report;
    let code = trace.code_under_test.describe();
    let level = match &trace.memory_left_out {
        None => "byte level".to_string(),
        Some(why) => format!(
            "pairs only: coverage, transferred_or_zeroed and neighbour_preservation skipped, {why}"
        ),
    };
    let first = |verdict: &str| format!("{}: {code}: {verdict}", f.display());
    match &r.outcome {
        Outcome::Error { message } => Judged::error(format!("{}: {message}", f.display())),
        Outcome::ExpectedRejection { message, .. } => {
            let message = format!("SGLang refused the case as the geometry expects: {message}");
            let line = first(&format!("REJECTED: {message}"));
            Judged::new(Verdict::Rejected, message, vec![line])
        }
        _ if r.passed() => {
            let message = format!("OK ({level})");
            Judged::new(Verdict::Passed, message.clone(), vec![first(&message)])
        }
        outcome => {
            let mut message = format!("{} ({level})", outcome.describe());
            let mut lines = vec![first(&message)];
            for v in r.violations.iter().take(10) {
                lines.push(format!("  {v}"));
                message.push_str(&format!("; {v}"));
            }
            Judged::new(Verdict::Violations, message, lines)
        }
    }
}

fn check_v1(f: &Path, case: &TraceCase) -> Judged {
    if let Some((rank, why)) = case
        .remotes
        .iter()
        .find_map(|r| r.refused.as_ref().map(|why| (r.tp_rank, why)))
    {
        let message = format!("vLLM refused the handshake of remote rank {rank}: {why}");
        let line = format!("{}: REJECTED: {message}", f.display());
        return Judged::new(Verdict::Rejected, message, vec![line]);
    }
    match check_case(case) {
        Ok(r) => {
            let mut lines = Vec::new();
            let mut message;
            let verdict = if r.violations.is_empty() {
                lines.push(format!("{}: OK", f.display()));
                message = "OK".to_string();
                Verdict::Passed
            } else {
                lines.push(format!(
                    "{}: {} violations",
                    f.display(),
                    r.violations.len()
                ));
                message = format!("{} violations", r.violations.len());
                for x in r.violations.iter().take(10) {
                    lines.push(format!("  {x}"));
                    message.push_str(&format!("; {x}"));
                }
                Verdict::Violations
            };
            for note in &r.notes {
                lines.push(format!("  note: {note}"));
                message.push_str(&format!("; note: {note}"));
            }
            let mut judged = Judged::new(verdict, message, lines);
            judged.skipped = r.skipped;
            judged
        }
        Err(e) => Judged::error(format!("{}: {e}", f.display())),
    }
}
