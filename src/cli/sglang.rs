//! `kvgeom sweep --connector sglang`: SGLang's own P/D KV transfer
//! (sglang-driver/) on `stack = "sglang"` geometries, judged by kvgeom's
//! SGLang oracles (`crate::sglang`). SGLang's transfer is push: `--mode
//! pull` is refused, and so is every option of another connector.

use super::{AllocArg, ModeArg, SweepArgs, EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK};
use crate::geometry::{Mode, Stack};
use crate::report::sweep_report::{self, Format};
use crate::scenario::{CaseReport, MemoryKind, TransportKind};
use crate::scheduler::DecodeAllocation;
use crate::sglang::connector::{judge_record, run_sweep_recording, SglangConnector};
use crate::sglang::run::{SglangCase, TraceTarget};
use crate::sweep::plan::{self, SourcedGeometry};
use crate::sweep::shard::parse_shard;
use crate::under_test::expectations::Expectations;
use crate::under_test::ConnectorUnderTest;
use crate::under_test::{judge_sweep, CodeUnderTest};

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

/// The SGLang geometries of `sources`; vLLM's are skipped with one note
/// line (the mirror of `vllm_stack_only`), and none at all is exit 2.
fn sglang_stack_only(sources: Vec<SourcedGeometry>) -> Result<Vec<SourcedGeometry>, u8> {
    let (ours, others): (Vec<_>, Vec<_>) = sources
        .into_iter()
        .partition(|s| s.geometry.stack == Stack::Sglang);
    let why = "--connector sglang runs SGLang's pools, not vLLM's KV cache";
    if ours.is_empty() {
        eprintln!(
            "error: no SGLang geometry (stack = \"sglang\") among those named ({} of vLLM's stack): {why}",
            others.len()
        );
        return Err(EXIT_BAD_INPUT);
    }
    if !others.is_empty() {
        eprintln!(
            "note: {} vLLM-stack geometries skipped: {why}",
            others.len()
        );
    }
    Ok(ours)
}

/// `kvgeom explain --connector sglang FILE --prompt N [--seed S]`: one
/// case on SGLang's transfer, in push mode: the pools kvgeom models for
/// each rank, the request's pages, how SGLang's run ended and every
/// violation.
pub(crate) fn sglang_explain(args: super::ExplainArgs) -> u8 {
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
    if let Some((_, option)) = refused.iter().find(|(given, _)| *given) {
        eprintln!("error: {option} {other} (or is not there for SGLang yet)");
        return EXIT_BAD_INPUT;
    }
    if let Err(code) = super::prompt_option(args.prompt) {
        return code;
    }
    let geometry = match crate::derive::load_geometry_file(&args.geometry) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("error: {e}");
            return EXIT_BAD_INPUT;
        }
    };
    if geometry.stack != Stack::Sglang {
        eprintln!(
            "error: {}: a vLLM-stack geometry; --connector sglang runs SGLang's pools (stack = \"sglang\")",
            args.geometry.display()
        );
        return EXIT_BAD_INPUT;
    }
    let case = crate::scenario::Case {
        geometry: std::sync::Arc::new(geometry),
        file: Some(args.geometry.clone()),
        prompt_len: args.prompt,
        prefix_hit: 0,
        mode: Mode::Push,
        allocation: DecodeAllocation::Mainline,
        seed: args.seed,
        variant: crate::variant::Variant::KVGEOM,
    };
    let cases = std::slice::from_ref(&case);
    let placed = crate::sglang::connector::place(cases);
    let prepared = match placed.first() {
        Some(Ok(p)) => p.clone(),
        Some(Err(e)) => {
            eprintln!("error: {}: {e}", args.geometry.display());
            return EXIT_BAD_INPUT;
        }
        None => {
            eprintln!("error: the SGLang connector placed no case");
            return EXIT_BAD_INPUT;
        }
    };
    if let Err(code) = sglang_cases_fit(cases, &args.run) {
        return code;
    }
    let python = match sglang_python(&args.run) {
        Ok(p) => p,
        Err(code) => return code,
    };
    // An unwritable --record-trace is refused before the case runs.
    if let Some(path) = &args.record_trace {
        if let Err(code) = super::write_output("--record-trace", path, "") {
            return code;
        }
    }
    let target = args.record_trace.clone().map(TraceTarget::File);
    let connector = SglangConnector {
        python: &python,
        traces: target.as_ref(),
    };
    let judged = match connector.run(cases, placed, &judge_record) {
        Ok(j) => j,
        Err(e) => {
            eprintln!("error: {e}");
            return EXIT_BAD_INPUT;
        }
    };
    let Some(j) = judged.first() else {
        eprintln!("error: the SGLang driver judged no case");
        return EXIT_BAD_INPUT;
    };
    out!("{}", explain_text(&code_under_test(&judged), &prepared, j));
    if j.report.passed() {
        EXIT_OK
    } else {
        EXIT_FAILED
    }
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

/// `kvgeom sweep --connector sglang`.
pub(crate) fn sglang_sweep(args: SweepArgs) -> u8 {
    if let Some(why) = refused(&args) {
        eprintln!("error: {why}");
        return EXIT_BAD_INPUT;
    }
    if let ModeArg::Both = args.mode {
        eprintln!("note: SGLang's transfer is push: every case runs in push mode");
    }
    let prompt_list = match super::prompts_option(args.prompts.as_deref()) {
        Ok(p) => p,
        Err(code) => return code,
    };
    if let Err(code) = super::random_option(args.random) {
        return code;
    }
    let shard_of = match args.shard.as_deref().map(parse_shard).transpose() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: --shard {e}");
            return EXIT_BAD_INPUT;
        }
    };
    let paths = if args.paths.is_empty() {
        match super::checkout::checkout_path("geometries/sglang") {
            Ok(p) => vec![p],
            Err(e) => {
                eprintln!("error: {e}");
                return EXIT_BAD_INPUT;
            }
        }
    } else {
        args.paths.clone()
    };
    let sources = match plan::load_sources(&paths).map(sglang_stack_only) {
        Ok(Ok(s)) => s,
        Ok(Err(code)) => return code,
        Err(e) => {
            eprintln!("error: {e}");
            return EXIT_BAD_INPUT;
        }
    };
    let expectations = match args.expect.as_deref().map(Expectations::load).transpose() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("error: {e}");
            return EXIT_BAD_INPUT;
        }
    };
    let opts = plan::PlanOptions {
        prompts: prompt_list,
        modes: vec![Mode::Push],
        allocations: Some(vec![DecodeAllocation::Mainline]),
        variant: crate::variant::Variant::KVGEOM,
        seed: args.seed,
    };
    let all_cases = match args.random {
        Some(n) => plan::random(&sources, n, args.seed, &opts),
        None => plan::grid(&sources, &opts),
    };
    if let Err(code) = sglang_cases_fit(&all_cases, &args.run) {
        return code;
    }
    // A trace folder that cannot be made is refused before SGLang runs.
    if let Some(dir) = &args.record_traces {
        if let Err(e) = std::fs::create_dir_all(dir) {
            eprintln!("error: --record-traces {}: {e}", dir.display());
            return EXIT_BAD_INPUT;
        }
    }
    let python = match sglang_python(&args.run) {
        Ok(p) => p,
        Err(code) => return code,
    };
    let mut options = format!("{:?} connector sglang", args.random);
    if let Some(version) = python.nixl.version() {
        // Shards over real NIXL and over the stand-in never merge.
        options.push_str(&format!(" nixl real {version}"));
    }
    let (cases, shard) = super::shard_cases(all_cases, shard_of, &sources, &opts, &options);
    let started = std::time::Instant::now();
    let target = args.record_traces.clone().map(TraceTarget::Folder);
    let judged = match run_sweep_recording(&cases, &python, target.as_ref()) {
        Ok(j) => j,
        Err(e) => {
            eprintln!("error: {e}");
            return EXIT_BAD_INPUT;
        }
    };
    let code = code_under_test(&judged);
    eprintln!(
        "{} ({}), {}: {} cases in {:.1} s",
        code.describe(),
        python.python.display(),
        python.nixl,
        judged.len(),
        started.elapsed().as_secs_f64()
    );
    let expectations = expectations.or_else(|| default_expectations(&code));
    let reports: Vec<CaseReport> = judged.iter().map(|j| j.report.clone()).collect();
    let shard = shard.as_ref().map(|(s, p)| (s, p.as_slice()));
    let text = match args.format {
        Format::Table => table(&judged),
        Format::Json => json(&judged, shard, &code, &python.nixl),
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
    super::sglang_shrink::print_minimal_replays(&reports, &python, args.no_shrink);
    match &expectations {
        Some(e) => {
            if super::print_sweep_verdict(&judge_sweep(e, &reports, &code)) {
                EXIT_OK
            } else {
                EXIT_FAILED
            }
        }
        None if reports.iter().all(CaseReport::passed) => EXIT_OK,
        None => EXIT_FAILED,
    }
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
    let choice = run.nixl.unwrap_or_default().choice();
    let resolved = crate::driver::resolve(
        &crate::sglang::python::SGLANG_DRIVER,
        &python.python,
        &driver_dir,
        choice,
    )
    .map_err(|e| {
        eprintln!("error: {e}");
        EXIT_BAD_INPUT
    })?;
    if let Some(why) = &resolved.note {
        eprintln!("note: --nixl auto: real NIXL does not run here ({why}); the driver's stand-in moves the bytes");
    }
    python.nixl = resolved.run;
    Ok(python)
}

/// `nixl` (and `nixl_version` for real NIXL) on the report and each case,
/// as the vLLM driver's reports name them.
fn name_nixl(doc: &mut serde_json::Value, nixl: &crate::driver::NixlRun) {
    let put = |v: &mut serde_json::Value| {
        v["nixl"] = nixl.as_str().into();
        if let Some(version) = nixl.version() {
            v["nixl_version"] = version.into();
        }
    };
    put(doc);
    if let Some(cases) = doc.get_mut("cases").and_then(|c| c.as_array_mut()) {
        cases.iter_mut().filter(|c| c.is_object()).for_each(put);
    }
}

/// The SGLang and torch the driver reported (the first case that ran).
fn code_under_test(judged: &[SglangCase]) -> CodeUnderTest {
    let (sglang, torch) = judged
        .iter()
        .find_map(|j| j.versions.clone())
        .unwrap_or_else(|| ("unknown".into(), "unknown".into()));
    CodeUnderTest::sglang(&sglang, &torch)
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

/// The JSON report with each case's redundant writes added.
fn json(
    judged: &[SglangCase],
    shard: Option<(&crate::sweep::shard::Shard, &[usize])>,
    code: &CodeUnderTest,
    nixl: &crate::driver::NixlRun,
) -> String {
    let reports: Vec<CaseReport> = judged.iter().map(|j| j.report.clone()).collect();
    let text = sweep_report::json(&reports, shard, code);
    let Ok(mut doc) = serde_json::from_str::<serde_json::Value>(&text) else {
        return text;
    };
    name_nixl(&mut doc, nixl);
    if let Some(cases) = doc.get_mut("cases").and_then(|c| c.as_array_mut()) {
        for (case, j) in cases.iter_mut().zip(judged) {
            if let Some(obj) = case.as_object_mut() {
                // No kvgeom policy models SGLang's connector.
                obj.insert("policy".into(), serde_json::Value::Null);
                obj.insert("redundant_writes".into(), j.redundant_writes.into());
                obj.insert(
                    "redundant_write_bytes".into(),
                    j.redundant_write_bytes.into(),
                );
            }
        }
    }
    serde_json::to_string_pretty(&doc).unwrap_or(text)
}

/// The terminal table, each failure, and the redundant writes.
fn table(judged: &[SglangCase]) -> String {
    use std::fmt::Write;
    let reports: Vec<CaseReport> = judged.iter().map(|j| j.report.clone()).collect();
    let mut out = sweep_report::table(&reports);
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
    for j in judged.iter().filter(|j| j.redundant_writes > 0) {
        let name = j.report.case.geometry_name();
        match redundant.iter_mut().find(|(n, _, _)| *n == name) {
            Some(e) => {
                e.1 += j.redundant_writes;
                e.2 += j.redundant_write_bytes;
            }
            None => redundant.push((name, j.redundant_writes, j.redundant_write_bytes)),
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
