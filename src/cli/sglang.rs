//! `kvgeom sweep --connector sglang`: SGLang's own P/D KV transfer
//! (sglang-driver/) on `stack = "sglang"` geometries, judged by kvgeom's
//! SGLang oracles (`crate::sglang`). SGLang's transfer is push: `--mode
//! pull` is refused, and so is every option of another connector.

use std::path::PathBuf;

use super::pipeline::{
    expected_or_passed, nixl_fields, ran_line, refused_plan_options, resolve_nixl, Explained,
    Fields, Judged, OneCase, PipelineConnector, Swept,
};
use super::{AllocArg, ExplainArgs, ModeArg, SweepArgs, EXIT_BAD_INPUT};
use crate::geometry::{Mode, Stack};
use crate::report::sweep_report;
use crate::scenario::{Case, CaseReport, MemoryKind, TransportKind};
use crate::scheduler::DecodeAllocation;
use crate::sglang::connector::{judge_record, run_sweep_recording, SglangConnector};
use crate::sglang::run::{SglangCase, TraceTarget};
use crate::sweep::plan::{PlanOptions, SourcedGeometry};
use crate::under_test::expectations::Expectations;
use crate::under_test::CodeUnderTest;
use crate::under_test::ConnectorUnderTest;
use crate::variant::Variant;

fn refused(args: &SweepArgs) -> Option<String> {
    let other = "applies to another connector; --connector sglang runs SGLang's own transfer";
    if let Some(d) = &args.run.variant.defect {
        return Some(format!("--defect {d}: {other}"));
    }
    if let Some(p) = &args.run.variant.policy {
        return Some(format!("--policy {p}: {other}"));
    }
    if let Some(p) = &args.run.vllm_python {
        return Some(format!("--vllm-python {}: {other}", p.display()));
    }
    if args.run.transport == TransportKind::Nixl {
        return Some(format!("--transport nixl: {other}"));
    }
    if args.memory == MemoryKind::Vram {
        return Some("--memory vram: the SGLang driver runs SGLang's pools on host memory".into());
    }
    if args.compare_host {
        return Some("--compare-host: the SGLang driver always runs on host memory".into());
    }
    if let ModeArg::Pull = args.mode {
        return Some(
            "--mode pull: SGLang's P/D transfer is push (prefill writes into decode's pages)"
                .into(),
        );
    }
    if !matches!(args.alloc, AllocArg::Both) {
        return Some(
            "--alloc: SGLang's decode holds exactly the request's pages; there is no allocation model to choose"
                .into(),
        );
    }
    None
}

/// Why an option of `kvgeom explain --connector sglang` does not apply.
fn refused_explain(args: &ExplainArgs) -> Option<String> {
    let other = "applies to another connector; --connector sglang runs SGLang's own transfer";
    let refused = [
        (args.run.variant.defect.is_some(), "--defect"),
        (args.run.variant.policy.is_some(), "--policy"),
        (args.run.vllm_python.is_some(), "--vllm-python"),
        (
            args.run.transport == TransportKind::Nixl,
            "--transport nixl",
        ),
        (args.svg.is_some(), "--svg"),
        (args.prefix_hit != 0, "--prefix-hit"),
    ];
    refused
        .iter()
        .find(|(given, _)| *given)
        .map(|(_, option)| format!("{option} {other} (or is not there for SGLang yet)"))
}

/// `kvgeom explain --connector sglang FILE --prompt N [--seed S]`: one
/// case on SGLang's transfer, in push mode: the pools kvgeom models for
/// each rank, the request's pages, how SGLang's run ended and every
/// violation.
fn sglang_explain(args: &ExplainArgs, case: &Case) -> Result<Explained, u8> {
    let cases = std::slice::from_ref(case);
    let placed = crate::sglang::connector::place(cases);
    let prepared = match placed.first() {
        Some(Ok(p)) => p.clone(),
        Some(Err(e)) => {
            eprintln!("error: {}: {e}", args.geometry.display());
            return Err(EXIT_BAD_INPUT);
        }
        None => {
            eprintln!("error: the SGLang connector placed no case");
            return Err(EXIT_BAD_INPUT);
        }
    };
    sglang_cases_fit(cases, &args.run)?;
    let python = sglang_python(&args.run)?;
    // An unwritable --record-trace is refused before the case runs.
    if let Some(path) = &args.record_trace {
        super::write_output("--record-trace", path, "")?;
    }
    let target = args.record_trace.clone().map(TraceTarget::File);
    let connector = SglangConnector {
        python: &python,
        traces: target.as_ref(),
    };
    let judged = connector.run(cases, placed, &judge_record).map_err(|e| {
        eprintln!("error: {e}");
        EXIT_BAD_INPUT
    })?;
    let Some(j) = judged.first() else {
        eprintln!("error: the SGLang driver judged no case");
        return Err(EXIT_BAD_INPUT);
    };
    let code = SglangPipeline {
        python: None,
        versions: j.versions.clone(),
    }
    .code_under_test(&[]);
    Ok(Explained {
        text: explain_text(&code, &prepared, j),
        passed: j.report.passed(),
    })
}

/// The text of `kvgeom explain --connector sglang`.
fn explain_text(
    code: &CodeUnderTest,
    p: &crate::sglang::batch::Prepared,
    j: &SglangCase,
) -> String {
    use std::fmt::Write;
    let r = &j.report;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} on {}, prompt {} (push: SGLang's transfer), seed {}",
        code.describe(),
        r.case.geometry_name(),
        r.case.prompt_len,
        r.case.seed
    );
    for (pools, pages) in [
        (&p.prefill, &p.placement.prefill_pages),
        (&p.decode, &p.placement.decode_pages),
    ] {
        let _ = writeln!(
            out,
            "\n{}: attention TP {}, pages of {} tokens, {} pages (+ padding page 0); the request's pages {:?}",
            pools.side, pools.attn_tp, pools.page_size, pools.num_pages, pages
        );
        for rank in 0..pools.attn_tp {
            let regions = pools.regions(rank);
            let shown: Vec<String> = regions
                .iter()
                .map(|m| format!("{} {} B (page {} B)", m.what(), m.len, m.item_len))
                .collect();
            let _ = writeln!(
                out,
                "  {}-{rank}: heads {:?}; {}",
                pools.side,
                pools.global_heads(rank),
                shown.join(", ")
            );
        }
    }
    let _ = writeln!(
        out,
        "\nranks whose registered regions match kvgeom's model: {}",
        j.layout_checked
    );
    let _ = writeln!(
        out,
        "posted KV pairs: {} ({} bytes); redundant writes: {} pairs, {} bytes",
        r.stats.pairs, r.stats.transferred_bytes, j.redundant_writes, j.redundant_write_bytes
    );
    out.push_str(&super::sglang_state_explain::state_text(p));
    let _ = writeln!(out, "outcome: {}", r.outcome.describe());
    for v in r.violations.iter().take(50) {
        let _ = writeln!(out, "  {v}");
    }
    if r.violations.len() > 50 {
        let _ = writeln!(out, "  ... and {} more", r.violations.len() - 50);
    }
    out
}

/// SGLang's own transfer in the one sweep ([`super::pipeline`]): push
/// cases on SGLang's pools, run by the SGLang driver.
pub(crate) struct SglangPipeline {
    /// The interpreter with SGLang, once found.
    python: Option<crate::sglang::python::SglangPython>,
    /// The SGLang and torch the driver reported (the first case that ran).
    versions: Option<(String, String)>,
}

impl SglangPipeline {
    /// The connector before its interpreter is found.
    pub(crate) fn new() -> Self {
        SglangPipeline {
            python: None,
            versions: None,
        }
    }
}

impl PipelineConnector for SglangPipeline {
    fn refused(&self, args: &SweepArgs) -> Option<String> {
        refused_plan_options(args).or_else(|| refused(args))
    }

    fn stack(&self) -> Stack {
        Stack::Sglang
    }

    fn default_paths(&self) -> Result<Vec<PathBuf>, u8> {
        super::checkout::checkout_path("geometries/sglang")
            .map(|p| vec![p])
            .map_err(|e| {
                eprintln!("error: {e}");
                EXIT_BAD_INPUT
            })
    }

    fn plan_options(&self, args: &SweepArgs, prompts: Option<Vec<u32>>) -> Result<PlanOptions, u8> {
        if let ModeArg::Both = args.mode {
            eprintln!("note: SGLang's transfer is push: every case runs in push mode");
        }
        Ok(PlanOptions {
            prompts,
            modes: vec![Mode::Push],
            allocations: Some(vec![DecodeAllocation::Mainline]),
            variant: Variant::KVGEOM,
            seed: args.seed,
        })
    }

    fn start(
        &mut self,
        args: &SweepArgs,
        _sources: &[SourcedGeometry],
        cases: Vec<Case>,
    ) -> Result<Vec<Case>, u8> {
        sglang_cases_fit(&cases, &args.run)?;
        // A trace folder that cannot be made is refused before SGLang runs.
        if let Some(dir) = &args.record_traces {
            if let Err(e) = std::fs::create_dir_all(dir) {
                eprintln!("error: --record-traces {}: {e}", dir.display());
                return Err(EXIT_BAD_INPUT);
            }
        }
        self.python = Some(sglang_python(&args.run)?);
        Ok(cases)
    }

    fn shard_key(&self, args: &SweepArgs) -> String {
        let mut key = format!("{:?} connector sglang", args.random);
        if let Some(version) = self.python.as_ref().and_then(|p| p.nixl.version()) {
            // Shards over real NIXL and over the stand-in never merge.
            key.push_str(&format!(" nixl real {version}"));
        }
        key
    }

    fn run(&mut self, args: &SweepArgs, cases: &[Case]) -> Result<Vec<Judged>, u8> {
        let Some(python) = &self.python else {
            return Ok(Vec::new());
        };
        let started = std::time::Instant::now();
        let target = args.record_traces.clone().map(TraceTarget::Folder);
        let judged = run_sweep_recording(cases, python, target.as_ref()).map_err(|e| {
            eprintln!("error: {e}");
            EXIT_BAD_INPUT
        })?;
        self.versions = judged.iter().find_map(|j| j.versions.clone());
        ran_line(
            &self.code_under_test(&[]),
            &python.python,
            &python.nixl.to_string(),
            judged.len(),
            started,
        );
        let nixl = nixl_fields(&python.nixl);
        Ok(judged
            .into_iter()
            .map(|j| {
                let mut extras = nixl.clone();
                // No kvgeom policy models SGLang's connector.
                extras.insert("policy".into(), serde_json::Value::Null);
                extras.insert("redundant_writes".into(), j.redundant_writes.into());
                extras.insert(
                    "redundant_write_bytes".into(),
                    j.redundant_write_bytes.into(),
                );
                Judged {
                    report: j.report,
                    extras,
                }
            })
            .collect())
    }

    /// The SGLang and torch the driver reported.
    fn code_under_test(&self, _judged: &[Judged]) -> CodeUnderTest {
        let (sglang, torch) = self
            .versions
            .clone()
            .unwrap_or_else(|| ("unknown".into(), "unknown".into()));
        CodeUnderTest::sglang(&sglang, &torch)
    }

    fn expectations(
        &mut self,
        given: Option<Expectations>,
        code: &CodeUnderTest,
    ) -> Result<Option<Expectations>, u8> {
        Ok(given.or_else(|| default_expectations(code)))
    }

    fn table(&self, judged: &[Judged], reports: &[CaseReport]) -> String {
        table(judged, reports)
    }

    fn report_fields(&self) -> Fields {
        self.python
            .as_ref()
            .map(|p| nixl_fields(&p.nixl))
            .unwrap_or_default()
    }

    fn refused_explain(&self, args: &ExplainArgs) -> Option<String> {
        refused_explain(args)
    }

    fn one_case(&self, _args: &ExplainArgs) -> Result<(Mode, DecodeAllocation, Variant), u8> {
        Ok((Mode::Push, DecodeAllocation::Mainline, Variant::KVGEOM))
    }

    fn explain(&mut self, args: &ExplainArgs, one: OneCase) -> Result<Explained, u8> {
        sglang_explain(args, &one.case)
    }

    fn verdict(&mut self, sweep: &Swept<'_>) -> u8 {
        let Swept {
            expectations, code, ..
        } = *sweep;
        expected_or_passed(sweep.reports, expectations, code, "cases")
    }

    fn run_candidates(&mut self, cases: &[Case]) -> Option<Vec<CaseReport>> {
        let python = self.python.as_ref()?;
        match crate::sglang::connector::run_sweep(cases, python) {
            Ok(tried) => Some(tried.into_iter().map(|j| j.report).collect()),
            Err(e) => {
                eprintln!("note: shrinking failed ({e}); replays are of the cases as run");
                None
            }
        }
    }

    /// With `--sglang-python` unless the project's venv (or the
    /// environment's interpreter) ran it.
    fn replay_command(&self, case: &Case) -> String {
        match &self.python {
            Some(python) => replay_command(case, python),
            None => case.replay_command(),
        }
    }
}

/// The replay of `case` on the interpreter that ran it (the flag is left
/// out for the project's venv and for the environment's interpreter).
fn replay_command(case: &Case, python: &crate::sglang::python::SglangPython) -> String {
    let default = crate::driver::project_root()
        .join(".sglang-venv")
        .join("bin")
        .join("python");
    // The venv's folder, not the interpreter: a venv's python is a link to
    // the base interpreter, which every venv shares.
    let key = |p: &std::path::Path| {
        let dir = p.parent().and_then(|d| d.canonicalize().ok());
        (dir, p.file_name().map(|n| n.to_owned()))
    };
    let flag = if key(&python.python) == key(&default)
        || std::env::var_os(crate::sglang::python::ENV).is_some()
    {
        String::new()
    } else {
        format!(" --sglang-python {}", python.python.display())
    };
    format!("{}{flag}", case.replay_command())
}

/// Every case fits `--max-memory` (and an address-space limit) as SGLang
/// holds it ([`crate::sglang::memory`]), or the first that does not is
/// refused with exit 2, before any interpreter starts.
fn sglang_cases_fit(
    cases: &[crate::scenario::Case],
    run: &super::run_args::RunArgs,
) -> Result<(), u8> {
    let budget = super::max_memory_option(run.max_memory.as_deref())?;
    crate::sglang::memory::cases_fit(cases, &budget).map_err(|why| {
        eprintln!("error: {why}");
        EXIT_BAD_INPUT
    })
}

/// The interpreter with SGLang and `--nixl` resolved for it (the driver's
/// probe, `sglang-driver/real_nixl.py --probe`); `Err` is the exit status
/// after the error was printed.
fn sglang_python(
    run: &super::run_args::RunArgs,
) -> Result<crate::sglang::python::SglangPython, u8> {
    let mut python = crate::sglang::python::find(run.sglang_python.as_deref()).map_err(|e| {
        eprintln!("error: {e}");
        EXIT_BAD_INPUT
    })?;
    let driver_dir = python
        .driver
        .parent()
        .map(std::path::Path::to_path_buf)
        .unwrap_or_default();
    python.nixl = resolve_nixl(
        &crate::sglang::python::SGLANG_DRIVER,
        &python.python,
        &driver_dir,
        run.nixl,
    )?;
    Ok(python)
}

/// `expected/sglang-VERSION.toml` of the project, when it exists.
fn default_expectations(code: &CodeUnderTest) -> Option<Expectations> {
    let file = format!("expected/sglang-{}.toml", code.version);
    let path = crate::driver::project_root().join(&file);
    if !path.is_file() {
        return None;
    }
    match Expectations::load(&path) {
        Ok(e) => {
            eprintln!("note: judged against {file} (give --expect FILE for another)");
            Some(e)
        }
        Err(e) => {
            eprintln!("note: {e}: not used");
            None
        }
    }
}

/// The terminal table, each failure, and the redundant writes.
fn table(judged: &[Judged], reports: &[CaseReport]) -> String {
    use std::fmt::Write;
    let mut out = sweep_report::table(reports);
    let failed: Vec<&CaseReport> = reports.iter().filter(|r| !r.passed()).collect();
    if !failed.is_empty() {
        let _ = writeln!(out, "\nfailures:");
    }
    for r in failed.iter().take(40) {
        let _ = writeln!(
            out,
            "- {} N={}: {}",
            r.case.geometry_name(),
            r.case.prompt_len,
            r.outcome.describe()
        );
        let _ = writeln!(out, "    replay: {}", r.case.replay_command());
        for v in r.violations.iter().take(3) {
            let _ = writeln!(out, "    {v}");
        }
    }
    let mut redundant: Vec<(&str, u64, u64)> = Vec::new();
    let count = |j: &Judged, field: &str| j.extras.get(field).and_then(|v| v.as_u64());
    for j in judged {
        let pairs = count(j, "redundant_writes").unwrap_or(0);
        if pairs == 0 {
            continue;
        }
        let bytes = count(j, "redundant_write_bytes").unwrap_or(0);
        let name = j.report.case.geometry_name();
        match redundant.iter_mut().find(|(n, _, _)| *n == name) {
            Some(e) => {
                e.1 += pairs;
                e.2 += bytes;
            }
            None => redundant.push((name, pairs, bytes)),
        }
    }
    if !redundant.is_empty() {
        let _ = writeln!(
            out,
            "\nredundant writes (a decode byte written again with the bytes it already held; no violation):"
        );
        for (name, pairs, bytes) in redundant {
            let _ = writeln!(out, "- {name}: {pairs} pairs, {bytes} bytes");
        }
    }
    out
}
