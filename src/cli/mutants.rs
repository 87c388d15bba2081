//! `kvgeom defects` and `kvgeom mutants`.

use std::path::PathBuf;

use super::{default_paths, EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK};
use crate::defects::Defect;
use crate::scenario::RunOptions;
use crate::sweep::mutants::run_mutant;
use crate::sweep::plan;

/// The defects' grid (the defect changes no case's size) passes the sweep's
/// checks before anything is allocated.
fn grid_fits(
    sources: &[plan::SourcedGeometry],
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
    let cases = plan::grid(sources, &plan::PlanOptions::default());
    for case in &cases {
        super::pools_hold(case)?;
    }
    super::cases_fit(&cases, budget, false)
}

pub fn defects() -> u8 {
    for d in Defect::ALL {
        println!("{:<28} {}", d.name(), d.description());
        println!("{:<28} symptom: {}", "", d.symptom());
    }
    EXIT_OK
}

pub fn mutants(paths: Vec<PathBuf>, threads: Option<usize>, max_memory: Option<&str>) -> u8 {
    let threads = match super::threads_within_limit(threads) {
        Ok(t) => t,
        Err(code) => return code,
    };
    let budget = match super::max_memory_option(max_memory) {
        Ok(b) => b,
        Err(code) => return code,
    };
    let sources = match plan::load_sources(&default_paths(paths)) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return EXIT_BAD_INPUT;
        }
    };
    // The grid every defect runs, refused as the sweep refuses it: a default
    // prompt sweep too long, a pool too small, a case over the budget.
    if let Err(code) = grid_fits(&sources, &budget) {
        return code;
    }
    let opts = RunOptions::default();
    let results: Vec<_> = Defect::ALL
        .iter()
        .map(|&d| run_mutant(&sources, d, &opts, threads, false))
        .collect();
    println!(
        "{:<28} {:<7} {:>13}  first failing case",
        "defect", "result", "failed cases"
    );
    let mut missed = 0;
    for r in &results {
        let verdict = if r.failed > 0 { "caught" } else { "MISSED" };
        if r.failed == 0 {
            missed += 1;
        }
        let first = r.first.as_ref().map_or(String::from("-"), |(c, why)| {
            format!(
                "{} N={} {} ({why})\n{:<52}replay: {}",
                c.geometry_name(),
                c.prompt_len,
                c.mode,
                "",
                c.replay_command()
            )
        });
        println!(
            "{:<28} {:<7} {:>6}/{:<6}  {first}",
            r.defect.name(),
            verdict,
            r.failed,
            r.cases
        );
    }
    println!("\n{} caught, {} missed", results.len() - missed, missed);
    if missed > 0 {
        EXIT_FAILED
    } else {
        EXIT_OK
    }
}
