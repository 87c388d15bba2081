//! `kvgeom explain`.

use std::path::PathBuf;
use std::sync::Arc;

use super::{OneAllocArg, OneModeArg, RunArgs, EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK};
use crate::derive::load_geometry_file;
use crate::report::explain::{explain_text, svg};
use crate::scenario::run::check_prefix_hit;
use crate::scenario::{Case, Outcome, RunOptions, TransportKind};
use crate::under_test::run_case_detailed;

/// The command line of `kvgeom explain`. Four of the shared options are
/// described here for one case (the sweep's wording is the full one).
#[derive(Clone, Debug, clap::Args)]
#[command(
    mut_arg("max_memory", |a| a.help(
        "Memory the case may use (e.g. 1.5G; default: half of the memory available); \
         a larger case is refused before it allocates"
    )),
    mut_arg("connector", |a| a.help("Which connector runs: kvgeom's, or vLLM's own from the venv")),
    mut_arg("vllm_python", |a| a.help("The Python interpreter with vLLM (see `sweep --vllm-python`)")),
    mut_arg("nixl", |a| a.help("With --connector vllm or sglang: what moves the bytes (see `sweep --nixl`)")),
)]
pub struct ExplainArgs {
    pub geometry: PathBuf,
    #[arg(long)]
    pub prompt: u32,
    #[arg(long, default_value_t = 0)]
    pub prefix_hit: u32,
    /// One case: pull or push (a sweep runs both).
    #[arg(long, value_enum, default_value = "pull")]
    pub mode: OneModeArg,
    /// One case: mainline or with-last-token (a sweep runs both).
    #[arg(long, value_enum, default_value = "mainline")]
    pub alloc: OneAllocArg,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[command(flatten)]
    pub run: RunArgs,
    /// Also write an SVG byte map of decode's request blocks.
    #[arg(long)]
    pub svg: Option<PathBuf>,
    /// Save the case's trace (v2 with --connector vllm, v3 with kvgeom's
    /// connector; memory images for a case of at most 1 MiB) as FILE
    /// (gzipped when FILE ends in .gz).
    #[arg(long, value_name = "FILE")]
    pub record_trace: Option<PathBuf>,
}

/// `kvgeom explain --connector kvgeom`.
pub(crate) fn kvgeom_explain(args: ExplainArgs) -> u8 {
    let variant = match args.run.variant.variant() {
        Ok(v) => v,
        Err(code) => return code,
    };
    let geometry = match load_geometry_file(&args.geometry) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("error: {e}");
            return EXIT_BAD_INPUT;
        }
    };
    if let Err(code) = super::refuse_other_stack(&geometry, &args.geometry) {
        return code;
    }
    if let Err(code) = super::prompt_option(args.prompt) {
        return code;
    }
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
        return EXIT_BAD_INPUT;
    }
    let case = Case {
        geometry: Arc::new(geometry),
        file: Some(args.geometry.clone()),
        prompt_len: args.prompt,
        prefix_hit: args.prefix_hit,
        mode: args.mode.mode(),
        allocation: args.alloc.allocation(),
        seed: args.seed,
        variant,
    };
    // An unwritable --svg is refused before the case runs.
    if let Some(path) = &args.svg {
        if let Err(code) = super::write_output("--svg", path, "") {
            return code;
        }
    }
    if let Some(path) = &args.record_trace {
        if let Err(code) = super::write_output("--record-trace", path, "") {
            return code;
        }
    }
    if let Err(code) = super::pools_hold(&case) {
        return code;
    }
    let budget = match super::max_memory_option(args.run.max_memory.as_deref()) {
        Ok(b) => b,
        Err(code) => return code,
    };
    // With --svg, the byte map keeps one class byte per byte of decode's
    // request blocks: at most every decode rank's arenas again.
    let need = crate::scenario::estimate_memory(&case);
    let every_rank = args.run.transport == TransportKind::Nixl;
    let mapped = need.mapped_bytes(every_rank);
    let svg_bytes = if args.svg.is_some() {
        need.decode_rank_bytes
            .saturating_mul(u64::from(need.decode_ranks))
    } else {
        0
    };
    let bytes = mapped.saturating_add(svg_bytes);
    if bytes > budget.bytes {
        let extra = (svg_bytes > 0).then_some((svg_bytes, "for the --svg byte map"));
        eprintln!(
            "error: {}",
            need.refusal_of(&case, every_rank, extra, &budget)
        );
        return EXIT_BAD_INPUT;
    }
    let run = run_case_detailed(
        &case,
        &RunOptions {
            transport: args.run.transport,
            ..RunOptions::default()
        },
    );
    if let Outcome::Error { message } = &run.report.outcome {
        eprintln!("error: {message}");
        return EXIT_BAD_INPUT;
    }
    out!("{}", explain_text(&run));
    if let Some(path) = &args.record_trace {
        let code = crate::under_test::CodeUnderTest::kvgeom(case.variant);
        if let Err(e) = crate::trace::write_trace(&run, &code, path) {
            eprintln!("error: --record-trace: {e}");
            return EXIT_BAD_INPUT;
        }
    }
    if let Some(path) = &args.svg {
        if let Err(code) = super::write_output("--svg", path, &svg(&run)) {
            return code;
        }
    }
    if run.report.passed() {
        EXIT_OK
    } else {
        EXIT_FAILED
    }
}
