//! `kvgeom matrix`: the live sweep over several vLLM releases (one
//! interpreter each), summed per geometry, mode and release, each release
//! held to its own expectations file where one exists, and every known
//! defect probed on the cases that expose it (docs/report-format.md,
//! "Matrix report").

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

use serde::Serialize;

use super::run_args::RequestsArg;
use super::{AllocArg, ModeArg, EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK};
use crate::connector::NamedPolicy;
use crate::defects::Defect;
use crate::geometry::Mode;
use crate::live;
use crate::live::{DefectProbe, LiveReport, ProbeSeen};
use crate::scenario::{Case, CaseReport, Outcome, Stats};
use crate::sweep::plan;
use crate::under_test::expectations::Expectations;
use crate::under_test::{CodeUnderTest, Release};

/// The JSON report's schema.
pub const MATRIX_SCHEMA: &str = "kvgeom-matrix/1";

/// `kvgeom matrix`'s options.
#[derive(Clone, Debug, clap::Args)]
pub struct MatrixArgs {
    /// Geometry files or folders (default: the `*.toml` files of geometries/,
    /// not its subfolders).
    pub paths: Vec<PathBuf>,
    /// A Python interpreter with a vLLM release, one per release (the
    /// matrix's columns, in this order).
    #[arg(long = "vllm-python", value_name = "PATH", required = true)]
    pub vllm_python: Vec<PathBuf>,
    /// Prompt lengths, e.g. `2..=39,41` (default: each file's own list or the residue sweep).
    #[arg(long)]
    pub prompts: Option<String>,
    #[arg(long, value_enum, default_value = "both")]
    pub mode: ModeArg,
    /// Decode allocation model (both: every hybrid case runs with each).
    #[arg(long, value_enum, default_value = "both")]
    pub alloc: AllocArg,
    /// vLLM driver processes at once (default: one per core, at most 4).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Who makes each request: the driver from kvgeom's placement (direct,
    /// the default here) or vLLM's own scheduler (mainline cases; a
    /// with-last-token case always runs direct).
    #[arg(long, value_enum, value_name = "WHO")]
    pub requests: Option<RequestsArg>,
    /// What standard output gets.
    #[arg(long, value_enum, default_value = "table")]
    pub format: MatrixFormat,
    /// Also write the JSON report (`kvgeom-matrix/1`) to this file.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Keep each release's sweep report here (JSON); a release whose report
    /// is there for the same interpreter, vLLM and cases is not run again.
    #[arg(long, value_name = "DIR")]
    pub out_dir: Option<PathBuf>,
}

/// `--format` of `kvgeom matrix`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum MatrixFormat {
    Table,
    Json,
}

/// One release's run, live or read back from `--out-dir`.
struct Ran {
    code: CodeUnderTest,
    /// The kvgeom policy its plans were compared with: its own release's,
    /// or, for a release kvgeom does not model, the nearest modelled one.
    compared_with: NamedPolicy,
    reports: Vec<CaseReport>,
    plan_equal: Vec<bool>,
    probes: Vec<Vec<(Defect, ProbeSeen)>>,
    seconds: f64,
    reused: Option<PathBuf>,
}

/// A column of the matrix.
struct Column {
    python: PathBuf,
    /// The release, once known.
    version: Option<String>,
    run: Result<Ran, NotRun>,
    report: Option<PathBuf>,
}

/// Why a release's column was not run.
#[derive(Debug, thiserror::Error)]
enum NotRun {
    /// Its interpreter could not be used.
    #[error(transparent)]
    Interpreter(live::FindError),
    /// Its sweep could not run (the message in one paragraph).
    #[error("{}", one_paragraph(&.0.to_string()))]
    Sweep(#[source] live::BatchError),
    /// Its release's allowed plan differences do not load.
    #[error(transparent)]
    PlanDifferences(#[from] crate::under_test::plan_differences::PlanDifferencesError),
}

/// The counts of one geometry, mode and release.
#[derive(Clone, Debug, Default, Serialize)]
struct Cell {
    cases: usize,
    passed: usize,
    /// Passed cases that wrote some bytes more than once, with the same
    /// content (a cost, not a violation).
    #[serde(skip_serializing_if = "is_zero")]
    redundant_writes: usize,
    /// The most pairs writing one destination byte among them (`k`x).
    #[serde(skip_serializing_if = "is_zero_u32")]
    multiplicity: u32,
    refused: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    refused_reason: Option<String>,
    violations: usize,
    oracles: Vec<String>,
    crashed: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    crashed_reason: Option<String>,
    hung: usize,
    not_reachable: usize,
    errors: usize,
    plan_differs: usize,
    /// Whether the cell equals its release's expectations (`None`: the
    /// release has none, the cell is information).
    expected: Option<bool>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    disagreements: Vec<String>,
}

/// How one defect shows in one release.
#[derive(Clone, Debug, Serialize)]
struct DefectRow {
    defect: &'static str,
    exposed: usize,
    with: usize,
    without: usize,
    neither: usize,
    verdict: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    first_with: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    first_without: Option<String>,
}

/// `kvgeom matrix`.
pub fn matrix(args: MatrixArgs) -> u8 {
    match run(&args) {
        Ok(code) => code,
        Err(code) => code,
    }
}

fn bad(message: impl std::fmt::Display) -> u8 {
    eprintln!("error: {message}");
    EXIT_BAD_INPUT
}

/// The `*.toml` files directly in geometries/ (the sweep's synthetic
/// geometries), sorted.
fn default_geometries() -> Result<Vec<PathBuf>, u8> {
    let dir = super::checkout::checkout_path("geometries").map_err(bad)?;
    let entries = std::fs::read_dir(&dir).map_err(|e| bad(format!("{}: {e}", dir.display())))?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "toml"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(bad(format!("{}: no geometry files", dir.display())));
    }
    Ok(files)
}

fn run(args: &MatrixArgs) -> Result<u8, u8> {
    let drivers =
        super::sweep::threads_within_limit(args.threads)?.unwrap_or_else(live::default_drivers);
    let prompts = super::prompts_option(args.prompts.as_deref())?;
    let paths = if args.paths.is_empty() {
        default_geometries()?
    } else {
        args.paths.clone()
    };
    let sources = match plan::load_sources(&paths)
        .map(|s| super::pipeline::of_stack(s, crate::geometry::Stack::Vllm))
    {
        Ok(Ok(s)) => s,
        Ok(Err(code)) => return Err(code),
        Err(e) => return Err(bad(e)),
    };
    let opts = plan::PlanOptions {
        prompts,
        modes: args.mode.modes(),
        allocations: args.alloc.allocations(),
        variant: super::live::planned_variant(),
        seed: 0,
    };
    // The matrix's committed runs are direct: scheduler requests only when asked.
    let requests = match args.requests {
        None => live::Requests::Direct,
        asked => super::live::requests_option(asked, opts.allocations.as_deref())?,
    };
    let planned = plan::grid(&sources, &opts);
    let budget = super::max_memory_option(None)?;
    super::prepared_cases_fit(&planned, &budget)?;
    if let Some(dir) = &args.out_dir {
        std::fs::create_dir_all(dir)
            .map_err(|e| bad(format!("--out-dir {}: cannot create: {e}", dir.display())))?;
    }
    let geometries: Vec<String> = sources.iter().map(|s| s.geometry.name.clone()).collect();
    let started = Instant::now();
    let mut columns = Vec::new();
    for (i, python) in args.vllm_python.iter().enumerate() {
        eprintln!(
            "[{}/{}] {}: {} cases over {} geometries",
            i + 1,
            args.vllm_python.len(),
            python.display(),
            planned.len(),
            geometries.len()
        );
        let column = run_release(python, &planned, &sources, drivers, requests, args);
        match &column.run {
            Ok(r) => eprintln!(
                "[{}/{}] {}: {} cases in {:.1} s{}",
                i + 1,
                args.vllm_python.len(),
                r.code.describe(),
                r.reports.len(),
                r.seconds,
                r.reused
                    .as_ref()
                    .map_or(String::new(), |p| format!(" (reused {})", p.display()))
            ),
            Err(why) => eprintln!(
                "[{}/{}] {}: not run: {why}",
                i + 1,
                args.vllm_python.len(),
                python.display()
            ),
        }
        columns.push(column);
    }
    let seconds = started.elapsed().as_secs_f64();
    eprintln!("matrix: {} releases in {seconds:.1} s", columns.len());
    let built = build(&geometries, &opts.modes, &columns)?;
    let json = to_json(&built, &columns, &geometries, seconds);
    if let Some(out) = &args.out {
        super::write_output("--out", out, &json)?;
    }
    match args.format {
        MatrixFormat::Json => out!("{json}"),
        MatrixFormat::Table => out!("{}", table(&built, &columns)),
    }
    let differs = built.cells.iter().any(|(_, row)| {
        row.iter()
            .any(|c| c.as_ref().is_some_and(|c| c.expected == Some(false)))
    }) || built.unjudged_expected.iter().any(|x| *x);
    Ok(if differs { EXIT_FAILED } else { EXIT_OK })
}

/// A file-name-safe name of an interpreter's path.
fn slug(python: &Path) -> String {
    let text = python.display().to_string();
    let mut out = String::new();
    for c in text.chars() {
        if c.is_ascii_alphanumeric() || c == '.' {
            out.push(c);
        } else if !out.ends_with('-') && !out.is_empty() {
            out.push('-');
        }
    }
    let trimmed = out.trim_matches(|c| c == '-' || c == '.').to_string();
    if trimmed.is_empty() {
        "python".to_string()
    } else {
        trimmed
    }
}

fn run_release(
    python: &Path,
    planned: &[Case],
    sources: &[plan::SourcedGeometry],
    drivers: usize,
    requests: live::Requests,
    args: &MatrixArgs,
) -> Column {
    let report = args
        .out_dir
        .as_ref()
        .map(|d| d.join(format!("{}.json", slug(python))));
    let mut interpreter = match live::find(Some(python), Release::pinned().version) {
        Ok(p) => p,
        Err(e) => {
            return Column {
                python: python.to_path_buf(),
                version: None,
                run: Err(NotRun::Interpreter(e)),
                report,
            }
        }
    };
    let code = interpreter.code_under_test();
    interpreter.reference = code.reference_policy();
    let column = |run| Column {
        python: python.to_path_buf(),
        version: Some(interpreter.vllm_version.clone()),
        run,
        report: report.clone(),
    };
    let compared_with = interpreter.compared_policy();
    // Each defect is probed around the release the plans are compared with:
    // toggled on that release's own defects.
    let probes = DefectProbe::around(&probe_base(&code, &interpreter.vllm_version).defects());
    let cases: Vec<Case> = planned
        .iter()
        .map(|c| Case {
            variant: crate::variant::Variant::Policy(compared_with),
            ..c.clone()
        })
        .collect();
    if let Some(path) = &report {
        if let Some(ran) = stored(path, python, &code, compared_with, &cases, requests) {
            return column(Ok(ran));
        }
    }
    let checks = super::live::block_checks(sources, &cases, &interpreter.vllm_version);
    let mut remaining: BTreeMap<String, usize> = BTreeMap::new();
    for c in &cases {
        *remaining.entry(c.geometry_name().to_string()).or_default() += 1;
    }
    let remaining = Mutex::new(remaining);
    let started = Instant::now();
    let version = interpreter.vllm_version.clone();
    let done = |case: &Case| {
        let Ok(mut left) = remaining.lock() else {
            return;
        };
        if let Some(n) = left.get_mut(case.geometry_name()) {
            *n -= 1;
            if *n == 0 {
                eprintln!(
                    "  vLLM {version}: {} done ({:.1} s)",
                    case.geometry_name(),
                    started.elapsed().as_secs_f64()
                );
            }
        }
    };
    // A modelled release's allowed plan differences
    // (expected/plan-differences/), loaded before any case runs.
    let allowed = match code
        .release()
        .map(|r| {
            crate::under_test::plan_differences::PlanDifferences::load(
                &crate::driver::project_root().join(r.plan_differences()),
                &crate::driver::project_root(),
            )
        })
        .transpose()
    {
        Ok(a) => a,
        Err(e) => return column(Err(e.into())),
    };
    let mut live = match live::run_sweep_probed(
        &cases,
        &checks,
        &interpreter,
        drivers,
        requests,
        &probes,
        &done,
    ) {
        Ok(l) => l,
        Err(e) => {
            return column(Err(NotRun::Sweep(e)));
        }
    };
    let seconds = started.elapsed().as_secs_f64();
    if let Some(allowed) = &allowed {
        super::live::mark_allowed(&mut live, allowed);
    }
    if let Some(path) = &report {
        let text = stored_json(&live, &interpreter, &code, compared_with, python, seconds);
        if let Err(e) = std::fs::write(path, text) {
            eprintln!("note: --out-dir: cannot write {}: {e}", path.display());
        }
    }
    column(Ok(Ran {
        code,
        compared_with,
        // A difference the release's file allows counts as none.
        plan_equal: live
            .iter()
            .map(|l| l.plan.equal || l.plan.allowed.is_some())
            .collect(),
        probes: live.iter().map(|l| l.probes.clone()).collect(),
        reports: live.into_iter().map(|l| l.report).collect(),
        seconds,
        reused: None,
    }))
}

/// The modelled release a column's plans are compared with and its defects
/// probed around: its own, or the nearest modelled one
/// ([`Release::nearest_vllm`]) for a release kvgeom does not model or code
/// that is no release (a modified install, a source tree).
fn probe_base(code: &CodeUnderTest, version: &str) -> &'static Release {
    code.release()
        .unwrap_or_else(|| Release::nearest_vllm(version))
}

/// An error's lines as one line (`; ` between them).
fn one_paragraph(text: &str) -> String {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}

/// A release's sweep report (the live sweep's JSON, each case with its
/// `probes`, and `matrix`: the interpreter, the policy its plans were
/// compared with and the run's time).
fn stored_json(
    live: &[LiveReport],
    python: &live::Interpreter,
    code: &CodeUnderTest,
    compared_with: NamedPolicy,
    path: &Path,
    seconds: f64,
) -> String {
    let text = super::live::json(live, None, &python.nixl, code);
    let Ok(mut doc) = serde_json::from_str::<serde_json::Value>(&text) else {
        return text;
    };
    doc["matrix"] = serde_json::json!({
        "python": path.display().to_string(),
        "compared_with": compared_with.name(),
        "seconds": seconds,
    });
    if let Some(cases) = doc["cases"].as_array_mut() {
        for (c, l) in cases.iter_mut().zip(live) {
            let probes: serde_json::Map<String, serde_json::Value> = l
                .probes
                .iter()
                .map(|(d, seen)| {
                    (
                        d.name().to_string(),
                        serde_json::to_value(seen).unwrap_or_default(),
                    )
                })
                .collect();
            c["probes"] = serde_json::Value::Object(probes);
        }
    }
    serde_json::to_string_pretty(&doc).map_or(text, |t| t + "\n")
}

/// A release's report from an earlier run, when it is of the same
/// interpreter, the same vLLM, compared with the same policy, and exactly
/// these cases, each made as `requests` makes it.
fn stored(
    path: &Path,
    python: &Path,
    code: &CodeUnderTest,
    compared_with: NamedPolicy,
    cases: &[Case],
    requests: live::Requests,
) -> Option<Ran> {
    let bytes = crate::limits::read_capped(path, 1 << 30).ok()?;
    let doc: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    if doc["matrix"]["python"].as_str() != Some(&python.display().to_string()) {
        return None;
    }
    // A report without the field predates it: its plans were compared with
    // whatever policy was pinned then, so it is not reused.
    if doc["matrix"]["compared_with"].as_str() != Some(compared_with.name()) {
        return None;
    }
    let stored_code: CodeUnderTest = serde_json::from_value(doc["code_under_test"].clone()).ok()?;
    if &stored_code != code {
        return None;
    }
    let stored_cases = doc["cases"].as_array()?;
    if stored_cases.len() != cases.len() {
        return None;
    }
    let mut ran = Ran {
        code: stored_code,
        compared_with,
        reports: Vec::new(),
        plan_equal: Vec::new(),
        probes: Vec::new(),
        seconds: doc["matrix"]["seconds"].as_f64().unwrap_or(0.0),
        reused: Some(path.to_path_buf()),
    };
    for (c, case) in stored_cases.iter().zip(cases) {
        let same = c["geometry"].as_str() == Some(case.geometry_name())
            && c["prompt_len"].as_u64() == Some(u64::from(case.prompt_len))
            && c["prefix_hit"].as_u64() == Some(u64::from(case.prefix_hit))
            && c["mode"].as_str() == Some(case.mode.as_str())
            && c["allocation"].as_str() == Some(case.allocation.as_str())
            && c["request_path"].as_str().unwrap_or("direct") == requests.path_of(case).as_str();
        if !same {
            return None;
        }
        let violations = c["violations"]
            .as_array()?
            .iter()
            .map(|v| {
                let oracle = crate::oracle::by_name(v["oracle"].as_str()?)?;
                Some(crate::oracle::Violation::new(
                    oracle.name,
                    v["message"].as_str().unwrap_or_default(),
                ))
            })
            .collect::<Option<Vec<_>>>()?;
        let mut probes = Vec::new();
        for (name, seen) in c["probes"].as_object()? {
            probes.push((
                Defect::from_name(name)?,
                serde_json::from_value(seen.clone()).ok()?,
            ));
        }
        ran.reports.push(CaseReport {
            case: case.clone(),
            outcome: outcome_of(&c["outcome"])?,
            stats: Stats::default(),
            violations,
        });
        ran.plan_equal
            .push(c["plan"]["equal"].as_bool()? || c["plan"]["allowed"].is_string());
        ran.probes.push(probes);
    }
    Some(ran)
}

/// An outcome as the JSON report writes it.
fn outcome_of(v: &serde_json::Value) -> Option<Outcome> {
    let side = || serde_json::from_value(v["side"].clone()).ok();
    let message = || v["message"].as_str().map(str::to_string);
    Some(match v["kind"].as_str()? {
        "passed" => Outcome::Passed,
        "violations" => Outcome::Violations,
        "expected_rejection" => Outcome::ExpectedRejection {
            side: side()?,
            message: message()?,
        },
        "unexpected_rejection" => Outcome::UnexpectedRejection {
            side: side()?,
            message: message()?,
        },
        "missing_rejection" => Outcome::MissingRejection {
            expected: v["expected"].as_str()?.to_string(),
        },
        "crashed" => Outcome::Crashed {
            side: side()?,
            message: message()?,
        },
        "hung" => Outcome::Hung {
            message: message()?,
        },
        "error" => Outcome::Error {
            message: message()?,
        },
        _ => return None,
    })
}

/// One geometry and mode, and its cell per column.
type Row = ((String, Mode), Vec<Option<Cell>>);

/// The matrix: one row per geometry and mode, one cell per column (`None`
/// where the release did not run), and per column its defect rows.
struct Built {
    cells: Vec<Row>,
    defects: Vec<Vec<DefectRow>>,
    expectations: Vec<Option<PathBuf>>,
    /// A release with expectations that did not run (its cells cannot equal them).
    unjudged_expected: Vec<bool>,
}

/// The expectations file of a release as published, where one exists.
fn expectations_file(code: &CodeUnderTest) -> Option<PathBuf> {
    if code.source.is_some() || !code.modified_files.is_empty() {
        return None;
    }
    let file = crate::driver::project_root()
        .join("expected")
        .join(format!("vllm-{}.toml", code.version));
    file.is_file().then_some(file)
}

fn build(geometries: &[String], modes: &[Mode], columns: &[Column]) -> Result<Built, u8> {
    let mut cells: Vec<Row> = Vec::new();
    for g in geometries {
        for m in modes {
            cells.push(((g.clone(), *m), vec![None; columns.len()]));
        }
    }
    let mut defects = Vec::new();
    let mut expectations = Vec::new();
    let mut unjudged_expected = Vec::new();
    for (col, column) in columns.iter().enumerate() {
        let Ok(ran) = &column.run else {
            // A release that cannot run cannot equal its expectations.
            let has_file = column.version.as_ref().is_some_and(|v| {
                crate::driver::project_root()
                    .join("expected")
                    .join(format!("vllm-{v}.toml"))
                    .is_file()
            });
            unjudged_expected.push(has_file);
            defects.push(Vec::new());
            expectations.push(None);
            continue;
        };
        unjudged_expected.push(false);
        let file = expectations_file(&ran.code);
        let expect = match file.as_deref().map(Expectations::load).transpose() {
            Ok(e) => e.map(|e| e.without_messages()),
            Err(e) => return Err(bad(e)),
        };
        expectations.push(file);
        let reference = ran.code.reference_policy();
        for ((geometry, mode), row) in cells.iter_mut() {
            let idx: Vec<usize> = (0..ran.reports.len())
                .filter(|&i| {
                    let c = &ran.reports[i].case;
                    c.geometry_name() == geometry && c.mode == *mode
                })
                .collect();
            if idx.is_empty() {
                continue;
            }
            let reports: Vec<CaseReport> = idx.iter().map(|&i| ran.reports[i].clone()).collect();
            let mut cell = count(&reports);
            cell.plan_differs = idx.iter().filter(|&&i| !ran.plan_equal[i]).count();
            if let Some(e) = &expect {
                let mut disagreements = e.compare(&reports);
                if reference.is_some() && cell.plan_differs > 0 {
                    disagreements.push(format!(
                        "{} cases: vLLM's plan differs from kvgeom's --policy {}",
                        cell.plan_differs, ran.compared_with
                    ));
                }
                cell.expected = Some(disagreements.is_empty());
                cell.disagreements = disagreements.into_iter().take(5).collect();
            }
            row[col] = Some(cell);
        }
        defects.push(defect_rows(ran));
    }
    Ok(Built {
        cells,
        defects,
        expectations,
        unjudged_expected,
    })
}

/// The first words of a refusal or crash, as the matrix names its reason.
fn first_words(message: &str) -> String {
    let line = message.lines().next().unwrap_or_default().trim();
    let words: Vec<&str> = line.split_whitespace().take(10).collect();
    let mut text = words.join(" ");
    if text.chars().count() > 80 {
        text = text.chars().take(80).collect::<String>() + "...";
    }
    text
}

/// The most frequent of `reasons` (the first seen among equals).
fn dominant(reasons: &[String]) -> Option<String> {
    let mut counts: Vec<(&String, usize)> = Vec::new();
    for r in reasons {
        match counts.iter_mut().find(|(x, _)| *x == r) {
            Some((_, n)) => *n += 1,
            None => counts.push((r, 1)),
        }
    }
    let best = counts.iter().map(|(_, n)| *n).max()?;
    counts
        .into_iter()
        .find(|(_, n)| *n == best)
        .map(|(r, _)| r.clone())
}

fn count(reports: &[CaseReport]) -> Cell {
    let mut cell = Cell {
        cases: reports.len(),
        ..Cell::default()
    };
    let (mut refusals, mut crashes) = (Vec::new(), Vec::new());
    let mut oracles = std::collections::BTreeSet::new();
    for r in reports {
        match &r.outcome {
            Outcome::Passed if r.violations.is_empty() => {
                cell.passed += 1;
                let rewrites = r.stats.redundant_writes;
                if !rewrites.is_none() {
                    cell.redundant_writes += 1;
                    cell.multiplicity = cell.multiplicity.max(rewrites.multiplicity);
                }
            }
            Outcome::Passed | Outcome::Violations => {
                cell.violations += 1;
                oracles.extend(r.violations.iter().map(|v| v.oracle.to_string()));
            }
            Outcome::ExpectedRejection { message, .. }
            | Outcome::UnexpectedRejection { message, .. } => {
                cell.refused += 1;
                refusals.push(first_words(message));
            }
            Outcome::MissingRejection { .. } => {
                cell.violations += 1;
                oracles.insert("missing_rejection".to_string());
                oracles.extend(r.violations.iter().map(|v| v.oracle.to_string()));
            }
            Outcome::Crashed { message, .. } => {
                cell.crashed += 1;
                crashes.push(first_words(message));
            }
            Outcome::Hung { .. } => cell.hung += 1,
            Outcome::NotReachable { .. } => cell.not_reachable += 1,
            Outcome::Error { .. } => cell.errors += 1,
        }
    }
    cell.oracles = oracles.into_iter().collect();
    cell.refused_reason = dominant(&refusals);
    cell.crashed_reason = dominant(&crashes);
    cell
}

/// Each defect's probe in one release: on the cases that expose it (kvgeom's
/// plans with and without its decision differ), how often vLLM's plan
/// equals each.
fn defect_rows(ran: &Ran) -> Vec<DefectRow> {
    Defect::ALL
        .iter()
        .map(|&d| {
            let mut row = DefectRow {
                defect: d.name(),
                exposed: 0,
                with: 0,
                without: 0,
                neither: 0,
                verdict: "",
                first_with: None,
                first_without: None,
            };
            for (i, probes) in ran.probes.iter().enumerate() {
                for (_, seen) in probes.iter().filter(|(x, _)| *x == d) {
                    row.exposed += 1;
                    let label = || Some(ran.reports[i].case.label());
                    match seen {
                        ProbeSeen::With => {
                            row.with += 1;
                            if row.first_with.is_none() {
                                row.first_with = label();
                            }
                        }
                        ProbeSeen::Without => {
                            row.without += 1;
                            if row.first_without.is_none() {
                                row.first_without = label();
                            }
                        }
                        ProbeSeen::Neither => row.neither += 1,
                    }
                }
            }
            row.verdict = defect_verdict(row.with, row.without, row.exposed);
            row
        })
        .collect()
}

/// A release has a defect when, on the cases that expose it, vLLM's plan
/// equals the plan with the defect's decision and never the one without;
/// it lacks it in the opposite case.
pub fn defect_verdict(with: usize, without: usize, exposed: usize) -> &'static str {
    match (with > 0, without > 0) {
        _ if exposed == 0 => "not exposed",
        (true, false) => "has",
        (false, true) => "lacks",
        (true, true) => "mixed",
        (false, false) => "undetermined",
    }
}

fn to_json(built: &Built, columns: &[Column], geometries: &[String], seconds: f64) -> String {
    let releases: Vec<serde_json::Value> = columns
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let base = serde_json::json!({
                "python": c.python.display().to_string(),
                "version": c.version,
                "report": c.report.as_ref().map(|p| p.display().to_string()),
            });
            let mut v = base;
            match &c.run {
                Ok(r) => {
                    let judged: Vec<bool> = built
                        .cells
                        .iter()
                        .filter_map(|(_, row)| row[i].as_ref().and_then(|c| c.expected))
                        .collect();
                    v["status"] = "ran".into();
                    v["describe"] = r.code.describe().into();
                    v["compared_with"] = r.compared_with.name().into();
                    v["code_under_test"] = serde_json::to_value(&r.code).unwrap_or_default();
                    v["cases"] = r.reports.len().into();
                    v["seconds"] = serde_json::json!((r.seconds * 10.0).round() / 10.0);
                    v["reused"] = r.reused.is_some().into();
                    v["expectations"] = built.expectations[i].as_ref().map(|p| relative(p)).into();
                    v["as_expected"] = if built.expectations[i].is_some() {
                        judged.iter().all(|x| *x).into()
                    } else {
                        serde_json::Value::Null
                    };
                    v["defects"] = serde_json::to_value(&built.defects[i]).unwrap_or_default();
                }
                Err(why) => {
                    v["status"] = "not_run".into();
                    v["not_run"] = why.to_string().into();
                }
            }
            v
        })
        .collect();
    let mut cells = Vec::new();
    for ((geometry, mode), row) in &built.cells {
        for (i, cell) in row.iter().enumerate() {
            let mut v = match cell {
                Some(c) => serde_json::to_value(c).unwrap_or_default(),
                None => serde_json::json!({"not_run": true}),
            };
            v["geometry"] = geometry.clone().into();
            v["mode"] = mode.as_str().into();
            v["release"] = columns[i].version.clone().into();
            v["python"] = columns[i].python.display().to_string().into();
            cells.push(v);
        }
    }
    let doc = serde_json::json!({
        "schema": MATRIX_SCHEMA,
        "kvgeom_version": env!("CARGO_PKG_VERSION"),
        "probe_base": Release::pinned().policy.name(),
        "seconds": (seconds * 10.0).round() / 10.0,
        "geometries": geometries,
        "releases": releases,
        "cells": cells,
    });
    serde_json::to_string_pretty(&doc).unwrap_or_default() + "\n"
}

/// A path inside the project as the project names it.
fn relative(path: &Path) -> String {
    let root = crate::driver::project_root();
    path.strip_prefix(&root)
        .unwrap_or(path)
        .display()
        .to_string()
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

fn is_zero_u32(n: &u32) -> bool {
    *n == 0
}

/// One cell as the table prints it.
fn cell_text(cell: &Cell) -> String {
    let mut parts = Vec::new();
    if cell.passed > 0 {
        parts.push(format!("{} ok", cell.passed));
    }
    if cell.redundant_writes > 0 {
        parts.push(format!("{}x redundant writes", cell.multiplicity));
    }
    if cell.refused > 0 {
        parts.push(format!(
            "{} refused \"{}\"",
            cell.refused,
            short(cell.refused_reason.as_deref().unwrap_or_default(), 5)
        ));
    }
    if cell.violations > 0 {
        parts.push(format!(
            "{} VIOLATIONS [{}]",
            cell.violations,
            cell.oracles.join(",")
        ));
    }
    if cell.crashed > 0 {
        parts.push(format!(
            "{} crashed \"{}\"",
            cell.crashed,
            short(cell.crashed_reason.as_deref().unwrap_or_default(), 3)
        ));
    }
    if cell.hung > 0 {
        parts.push(format!("{} hung", cell.hung));
    }
    if cell.not_reachable > 0 {
        parts.push(format!("{} not reachable", cell.not_reachable));
    }
    if cell.errors > 0 {
        parts.push(format!("{} errors", cell.errors));
    }
    let mut text = parts.join(", ");
    match cell.expected {
        Some(false) => text.push_str(" (UNEXPECTED)"),
        Some(true) => text.push_str(" (as expected)"),
        None => {}
    }
    text
}

fn short(text: &str, words: usize) -> String {
    let w: Vec<&str> = text.split_whitespace().collect();
    if w.len() <= words {
        w.join(" ")
    } else {
        format!("{}...", w[..words].join(" "))
    }
}

fn table(built: &Built, columns: &[Column]) -> String {
    let headers: Vec<String> = columns
        .iter()
        .map(|c| match (&c.run, &c.version) {
            (Ok(r), _) => format!(
                "{} (plans vs --policy {})",
                r.code.describe(),
                r.compared_with
            ),
            (Err(_), Some(v)) => format!("vLLM {v}"),
            (Err(_), None) => c.python.display().to_string(),
        })
        .collect();
    let mut rows: Vec<Vec<String>> = Vec::new();
    for ((geometry, mode), row) in &built.cells {
        let mut r = vec![format!("{geometry} {}", mode.as_str())];
        for (cell, column) in row.iter().zip(columns) {
            r.push(match (cell, &column.run) {
                (Some(c), _) => cell_text(c),
                (None, Err(_)) => "not run".to_string(),
                (None, Ok(_)) => "-".to_string(),
            });
        }
        rows.push(r);
    }
    let mut widths: Vec<usize> = std::iter::once("geometry mode".len())
        .chain(headers.iter().map(|h| h.chars().count()))
        .collect();
    for r in &rows {
        for (w, text) in widths.iter_mut().zip(r) {
            *w = (*w).max(text.chars().count());
        }
    }
    let line = |cells: &[String]| -> String {
        let mut s = String::new();
        for (i, (text, w)) in cells.iter().zip(&widths).enumerate() {
            if i > 0 {
                s.push_str(" | ");
            }
            s.push_str(text);
            if i + 1 < cells.len() {
                s.push_str(&" ".repeat(w - text.chars().count()));
            }
        }
        s + "\n"
    };
    let mut out = line(
        &std::iter::once("geometry mode".to_string())
            .chain(headers.iter().cloned())
            .collect::<Vec<_>>(),
    );
    for r in &rows {
        out.push_str(&line(r));
    }
    out.push('\n');
    for (i, column) in columns.iter().enumerate() {
        match &column.run {
            Err(why) => out.push_str(&format!("{}: not run: {why}\n", column.python.display())),
            Ok(ran) => {
                let judged = match &built.expectations[i] {
                    Some(file) => {
                        let bad = built
                            .cells
                            .iter()
                            .filter(|(_, row)| {
                                row[i].as_ref().is_some_and(|c| c.expected == Some(false))
                            })
                            .count();
                        if bad == 0 {
                            format!("every cell as {} expects", relative(file))
                        } else {
                            format!("{bad} cells differ from {}", relative(file))
                        }
                    }
                    None => "no expectations file: information only".to_string(),
                };
                let has: Vec<&str> = built.defects[i]
                    .iter()
                    .filter(|d| d.verdict == "has")
                    .map(|d| d.defect)
                    .collect();
                let plan_differs: usize = built
                    .cells
                    .iter()
                    .filter_map(|(_, row)| row[i].as_ref().map(|c| c.plan_differs))
                    .sum();
                out.push_str(&format!(
                    "{} ({}): {} cases in {:.1} s{}; {plan_differs} plans differ from --policy {}; {judged}; defects shown: {}\n",
                    ran.code.describe(),
                    column.python.display(),
                    ran.reports.len(),
                    ran.seconds,
                    if ran.reused.is_some() {
                        " (reused)"
                    } else {
                        ""
                    },
                    ran.compared_with,
                    if has.is_empty() {
                        "none".to_string()
                    } else {
                        has.join(", ")
                    }
                ));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_defect_is_had_only_when_the_plans_show_it_and_never_its_absence() {
        assert_eq!(defect_verdict(3, 0, 5), "has");
        assert_eq!(defect_verdict(0, 4, 4), "lacks");
        assert_eq!(defect_verdict(1, 1, 2), "mixed");
        assert_eq!(defect_verdict(0, 0, 2), "undetermined");
        assert_eq!(defect_verdict(0, 0, 0), "not exposed");
    }

    #[test]
    fn interpreter_paths_become_plain_file_names() {
        assert_eq!(
            slug(Path::new(".vllm-venvs/0.31.0/bin/python")),
            "vllm-venvs-0.31.0-bin-python"
        );
        assert_eq!(slug(Path::new("/")), "python");
    }

    #[test]
    fn a_reason_is_its_first_words_and_the_most_frequent_wins() {
        assert_eq!(
            first_words("AssertionError: Local block size 4 is not divisible by remote block size 8 at all\nmore"),
            "AssertionError: Local block size 4 is not divisible by remote"
        );
        let r = |s: &str| s.to_string();
        assert_eq!(dominant(&[r("a"), r("b"), r("b")]), Some(r("b")));
        assert_eq!(dominant(&[]), None);
    }

    /// A column of `version` that ran no case, its plans compared with `policy`.
    fn ran_column(version: &str, policy: NamedPolicy) -> Column {
        Column {
            python: PathBuf::from(format!(".vllm-venvs/{version}/bin/python")),
            version: Some(version.to_string()),
            run: Ok(Ran {
                code: CodeUnderTest::vllm(version),
                compared_with: policy,
                reports: Vec::new(),
                plan_equal: Vec::new(),
                probes: Vec::new(),
                seconds: 1.0,
                reused: None,
            }),
            report: None,
        }
    }

    /// The policy of the modelled vLLM release `version`.
    fn vllm_policy(version: &str) -> NamedPolicy {
        Release::of_vllm(version)
            .expect("a modelled release")
            .policy
    }

    #[test]
    fn each_column_names_the_policy_its_plans_were_compared_with() {
        let columns = [
            ran_column("0.30.0", vllm_policy("0.33.0")),
            ran_column("0.34.0", vllm_policy("0.34.0")),
        ];
        let built = Built {
            cells: Vec::new(),
            defects: vec![Vec::new(), Vec::new()],
            expectations: vec![None, None],
            unjudged_expected: vec![false, false],
        };
        let doc: serde_json::Value =
            serde_json::from_str(&to_json(&built, &columns, &[], 1.0)).expect("JSON");
        assert_eq!(doc["releases"][0]["compared_with"], "vllm-0.33.0");
        assert_eq!(doc["releases"][1]["compared_with"], "vllm-0.34.0");
        let text = table(&built, &columns);
        let header = text.lines().next().unwrap_or_default();
        assert!(
            header.contains("vLLM 0.30.0 (plans vs --policy vllm-0.33.0)")
                && header.contains("vLLM 0.34.0 (plans vs --policy vllm-0.34.0)"),
            "{text}"
        );
    }

    #[test]
    fn a_release_is_probed_around_the_release_its_plans_are_compared_with() {
        for (version, base) in [
            ("0.31.0", "0.33.0"),
            ("0.33.0", "0.33.0"),
            ("0.34.0", "0.34.0"),
        ] {
            let code = CodeUnderTest::vllm(version);
            assert_eq!(probe_base(&code, version).version, base, "vLLM {version}");
        }
        let mut modified = CodeUnderTest::vllm("0.34.0");
        modified.modified_files = vec!["vllm/x.py".to_string()];
        assert_eq!(probe_base(&modified, "0.34.0").version, "0.34.0");
    }

    #[test]
    fn a_stored_report_compared_with_another_policy_is_not_reused() {
        let python = Path::new(".vllm-venvs/0.34.0/bin/python");
        let code = CodeUnderTest::vllm("0.34.0");
        let path =
            std::env::temp_dir().join(format!("kvgeom-matrix-stored-{}.json", std::process::id()));
        let report = |compared_with: Option<&str>| {
            let mut matrix =
                serde_json::json!({"python": python.display().to_string(), "seconds": 2.5});
            if let Some(p) = compared_with {
                matrix["compared_with"] = p.into();
            }
            serde_json::json!({
                "code_under_test": serde_json::to_value(&code).expect("JSON"),
                "matrix": matrix,
                "cases": [],
            })
            .to_string()
        };
        let read = |text: String| {
            std::fs::write(&path, text).expect("write");
            let ran = stored(
                &path,
                python,
                &code,
                vllm_policy("0.34.0"),
                &[],
                live::Requests::Direct,
            );
            ran.map(|r| r.compared_with)
        };
        assert_eq!(
            read(report(Some("vllm-0.34.0"))),
            Some(vllm_policy("0.34.0"))
        );
        assert_eq!(read(report(Some("vllm-0.33.0"))), None);
        assert_eq!(read(report(None)), None, "a report from before the field");
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn a_stored_outcome_reads_back() {
        for o in [
            Outcome::Passed,
            Outcome::Violations,
            Outcome::Crashed {
                side: crate::layout::Side::Decode,
                message: "IndexError".into(),
            },
            Outcome::Hung {
                message: "waits".into(),
            },
            Outcome::MissingRejection {
                expected: "x".into(),
            },
        ] {
            let v = serde_json::to_value(&o).expect("JSON");
            assert_eq!(outcome_of(&v), Some(o));
        }
        assert_eq!(outcome_of(&serde_json::json!({"kind": "other"})), None);
    }
}
