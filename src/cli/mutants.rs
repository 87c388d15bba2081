//! `kvgeom defects` and `kvgeom mutants`.

use std::path::PathBuf;

use super::{default_paths, EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK};
use crate::defects::{Defect, Effect};
use crate::scenario::RunOptions;
use crate::sweep::mutants::{run_mutant_sampled, MutantResult};
use crate::sweep::plan::{self, SourcedGeometry};

/// The JSON report's schema.
pub const MUTANTS_SCHEMA: &str = "kvgeom-mutants/1";

/// How `kvgeom mutants` prints its result.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum MutantsFormat {
    /// A table.
    #[default]
    Text,
    /// The JSON report (schema `kvgeom-mutants/1`).
    Json,
}

/// The command line of `kvgeom mutants`.
#[derive(Clone, Debug, clap::Args)]
pub struct MutantsArgs {
    pub paths: Vec<PathBuf>,
    #[arg(long)]
    pub threads: Option<usize>,
    /// Every case of the real-scale pairs in subfolders too (by default
    /// each runs the middle prompt of its list, both modes, mainline).
    #[arg(long)]
    pub full: bool,
    /// Output: text or json (schema `kvgeom-mutants/1`).
    #[arg(long, value_enum, default_value_t)]
    pub format: MutantsFormat,
    /// Memory the sweeps may use (e.g. 1.5G; default: half of the memory
    /// available, within an address-space limit); a larger case is
    /// refused before anything runs.
    #[arg(long, value_name = "SIZE")]
    pub max_memory: Option<String>,
}

/// The defects' grid (the defect changes no case's size) passes the sweep's
/// checks before anything is allocated.
fn grid_fits(
    sources: &[SourcedGeometry],
    sampled: &impl Fn(&SourcedGeometry) -> bool,
    budget: &crate::scenario::memory_estimate::Budget,
) -> Result<(), u8> {
    for s in sources {
        let file = s
            .file
            .as_ref()
            .map_or_else(|| s.geometry.name.clone(), |f| f.display().to_string());
        if let Err(e) = crate::sweep::prompts::check_default_sweep(&file, &s.geometry, false) {
            eprintln!("error: {e}");
            return Err(EXIT_BAD_INPUT);
        }
    }
    let cases = plan::sampled_grid(sources, &plan::PlanOptions::default(), sampled);
    for case in &cases {
        super::pools_hold(case)?;
    }
    super::cases_fit(&cases, budget, false)
}

pub fn defects() -> u8 {
    for d in Defect::ALL {
        outln!("{:<28} {}", d.name(), d.description());
        outln!("{:<28} symptom: {}", "", d.symptom());
    }
    super::lifecycle::print_variants();
    EXIT_OK
}

/// `kvgeom mutants [PATH...]`: the sweep once per defect. The files in a
/// subfolder of a folder given (the real-scale pairs of
/// `geometries/models/`) run their sample, as the default sweep's tests run
/// them, unless `full`.
pub fn mutants(args: MutantsArgs) -> u8 {
    let MutantsArgs {
        paths,
        threads,
        full,
        format,
        max_memory,
    } = args;
    let max_memory = max_memory.as_deref();
    let (threads, budget) = match super::threads_and_budget(threads, max_memory) {
        Ok(both) => both,
        Err(code) => return code,
    };
    let paths = match default_paths(paths) {
        Ok(p) => p,
        Err(code) => return code,
    };
    let sources = match plan::load_sources(&paths)
        .map(|s| super::pipeline::of_stack(s, crate::geometry::Stack::Vllm))
    {
        Ok(Ok(s)) => s,
        Ok(Err(code)) => return code,
        Err(e) => {
            eprintln!("error: {e}");
            return EXIT_BAD_INPUT;
        }
    };
    let sampled = |src: &SourcedGeometry| !full && plan::in_subfolder(&paths, src);
    // The grid every defect runs, refused as the sweep refuses it: a default
    // prompt sweep too long, a pool too small, a case over the budget.
    if let Err(code) = grid_fits(&sources, &sampled, &budget) {
        return code;
    }
    let opts = RunOptions::default();
    let results: Vec<_> = Defect::ALL
        .iter()
        .map(|&d| run_mutant_sampled(&sources, sampled, d, &opts, threads, false))
        .collect();
    let sampled_files: Vec<&SourcedGeometry> = sources.iter().filter(|s| sampled(s)).collect();
    let missed = results.iter().filter(|r| !r.as_described()).count();
    let lifecycle = match super::lifecycle::lifecycle_mutants(&paths) {
        Ok(l) => l,
        Err(code) => return code,
    };
    let lifecycle_missed = lifecycle.iter().filter(|v| v.caught_by.is_none()).count();
    match format {
        MutantsFormat::Text => {
            print_text(&results, &sampled_files, missed);
            super::lifecycle::print_variant_results(&lifecycle);
        }
        MutantsFormat::Json => {
            if let Err(code) = print_json(&results, &sampled_files, missed, &lifecycle) {
                return code;
            }
        }
    }
    if missed + lifecycle_missed > 0 {
        EXIT_FAILED
    } else {
        EXIT_OK
    }
}

/// What was sampled, in one sentence.
fn sample_line(sampled: &[&SourcedGeometry]) -> String {
    if sampled.is_empty() {
        return "sampled: nothing, every case of every file".to_string();
    }
    format!(
        "sampled: {} file(s) in subfolders (real-scale pairs), the middle prompt of each \
         in both modes with the mainline allocation; --full runs all their cases",
        sampled.len()
    )
}

fn print_text(results: &[MutantResult], sampled: &[&SourcedGeometry], missed: usize) {
    outln!("{}", sample_line(sampled));
    outln!(
        "{:<28} {:<7} {:>13}  first failing case",
        "defect",
        "result",
        "failed cases"
    );
    for r in results {
        let verdict = match (r.as_described(), r.defect.info().effect) {
            (true, Effect::Corrupts) => "caught",
            (true, Effect::Costs) => "cost",
            (false, Effect::Corrupts) => "MISSED",
            (false, Effect::Costs) => "NO COST",
        };
        let cost = format!(
            "judged right; {}x redundant writes in {} cases",
            r.multiplicity, r.redundant
        );
        let first = r.first.as_ref().map_or(cost, |(c, why)| {
            format!(
                "{} N={} {} ({why})\n{:<52}replay: {}",
                c.geometry_name(),
                c.prompt_len,
                c.mode,
                "",
                c.replay_command()
            )
        });
        outln!(
            "{:<28} {:<7} {:>6}/{:<6}  {first}",
            r.defect.name(),
            verdict,
            r.failed,
            r.cases
        );
    }
    let costs = results
        .iter()
        .filter(|r| r.defect.info().effect == Effect::Costs && r.as_described())
        .count();
    outln!(
        "\n{} caught, {costs} shown as a cost (the right bytes, written more than once), {} missed",
        results.len() - missed - costs,
        missed
    );
}

fn print_json(
    results: &[MutantResult],
    sampled: &[&SourcedGeometry],
    missed: usize,
    lifecycle: &[crate::lifecycle::sweep::VariantResult],
) -> Result<(), u8> {
    let file = |s: &&SourcedGeometry| s.file.as_ref().map(|f| f.display().to_string());
    let report = serde_json::json!({
        "schema": MUTANTS_SCHEMA,
        "sample": {
            "full": sampled.is_empty(),
            "sampled_files": sampled.iter().map(file).collect::<Vec<_>>(),
            "rule": "the middle prompt of the file's list, both modes, the mainline allocation",
        },
        "summary": {
            "defects": results.len(),
            "caught": results.iter().filter(|r| r.as_described() && r.caught()).count(),
            "costs": results.iter().filter(|r| r.as_described() && !r.caught()).count(),
            "missed": missed,
        },
        "defects": results.iter().map(|r| serde_json::json!({
            "defect": r.defect.name(),
            "effect": r.defect.info().effect,
            "caught": r.caught(),
            "as_described": r.as_described(),
            "cases": r.cases,
            "failed": r.failed,
            "redundant_write_cases": r.redundant,
            "multiplicity": r.multiplicity,
            "oracles": r.oracles.iter().collect::<Vec<_>>(),
            "first_failing_case": r.first.as_ref().map(|(c, why)| serde_json::json!({
                "geometry": c.geometry_name(),
                "file": c.file.as_ref().map(|f| f.display().to_string()),
                "prompt_len": c.prompt_len,
                "prefix_hit": c.prefix_hit,
                "mode": c.mode,
                "allocation": c.allocation,
                "why": why,
                "replay": c.replay_command(),
            })),
        })).collect::<Vec<_>>(),
        "lifecycle_variants": super::lifecycle::variant_results_json(lifecycle),
    });
    super::output::print_json_value(&report)
}
