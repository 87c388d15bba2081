//! `kvgeom defects` and `kvgeom mutants`.

use std::path::PathBuf;

use super::{default_paths, EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK};
use crate::defects::Defect;
use crate::scenario::{Case, RunOptions};
use crate::sweep::{execute, plan};

pub fn defects() -> u8 {
    for d in Defect::ALL {
        println!("{:<28} {}", d.name(), d.description());
        println!("{:<28} symptom: {}", "", d.symptom());
    }
    EXIT_OK
}

/// One defect's result.
#[derive(Clone, Debug)]
pub struct MutantResult {
    pub defect: Defect,
    pub cases: usize,
    pub failed: usize,
    pub first: Option<(Case, String)>,
}

/// Run the sweep of `paths` once per defect.
pub fn run_mutants(paths: &[PathBuf], threads: Option<usize>) -> Result<Vec<MutantResult>, String> {
    let sources = plan::load_sources(paths).map_err(|e| e.to_string())?;
    let opts = RunOptions::default();
    Ok(Defect::ALL
        .iter()
        .map(|&defect| {
            let cases = plan::grid(
                &sources,
                &plan::PlanOptions {
                    defect: Some(defect),
                    ..plan::PlanOptions::default()
                },
            );
            let reports = execute::run_all(&cases, &opts, threads);
            let failed: Vec<_> = reports.iter().filter(|r| !r.passed()).collect();
            let first = failed.first().map(|r| {
                let minimal = execute::shrink(&r.case, &opts);
                (minimal, r.outcome.describe())
            });
            MutantResult {
                defect,
                cases: reports.len(),
                failed: failed.len(),
                first,
            }
        })
        .collect())
}

pub fn mutants(paths: Vec<PathBuf>, threads: Option<usize>) -> u8 {
    let results = match run_mutants(&default_paths(paths), threads) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return EXIT_BAD_INPUT;
        }
    };
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
