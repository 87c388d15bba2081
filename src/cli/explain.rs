//! `kvgeom explain`.

use std::path::PathBuf;
use std::sync::Arc;

use super::{VariantArgs, EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK};
use crate::derive::load_geometry_file;
use crate::geometry::Mode;
use crate::report::explain::{explain_text, svg};
use crate::scenario::run::check_prefix_hit;
use crate::scenario::{Case, Outcome, RunOptions, TransportKind};
use crate::scheduler::DecodeAllocation;
use crate::under_test::run_case_detailed;

pub struct ExplainArgs {
    pub geometry: PathBuf,
    pub prompt: u32,
    pub prefix_hit: u32,
    pub mode: Mode,
    pub allocation: DecodeAllocation,
    pub seed: u64,
    pub variant: VariantArgs,
    pub transport: TransportKind,
    pub svg: Option<PathBuf>,
    /// `--max-memory SIZE`; `None`: half of the memory available.
    pub max_memory: Option<String>,
}

pub fn explain(args: ExplainArgs) -> u8 {
    let variant = match args.variant.variant() {
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
        mode: args.mode,
        allocation: args.allocation,
        seed: args.seed,
        variant,
    };
    // An unwritable --svg is refused before the case runs.
    if let Some(path) = &args.svg {
        if let Err(code) = super::write_output("--svg", path, "") {
            return code;
        }
    }
    if let Err(code) = super::pools_hold(&case) {
        return code;
    }
    let budget = match super::max_memory_option(args.max_memory.as_deref()) {
        Ok(b) => b,
        Err(code) => return code,
    };
    // With --svg, the byte map keeps one class byte per byte of decode's
    // request blocks: at most every decode rank's arenas again.
    let need = crate::scenario::estimate_memory(&case);
    let every_rank = args.transport == TransportKind::Nixl;
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
            transport: args.transport,
            ..RunOptions::default()
        },
    );
    if let Outcome::Error { message } = &run.report.outcome {
        eprintln!("error: {message}");
        return EXIT_BAD_INPUT;
    }
    print!("{}", explain_text(&run));
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
