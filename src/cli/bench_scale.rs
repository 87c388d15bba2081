//! `kvgeom bench scale`: real-scale cases against this machine's memcpy
//! and its memory (goals, reported; oracle failures fail the run).

use std::path::PathBuf;

use super::{EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK};
use crate::bench::scale::{scale_bench, DEFAULT_FILES};

/// How `bench scale` prints its report.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ScaleFormat {
    /// A table.
    #[default]
    Table,
    /// The JSON report (schema `kvgeom-bench-scale/1`).
    Json,
}

/// `kvgeom bench scale [FILE...]`: the shipped real-scale geometries when
/// no file is given.
pub fn bench_scale(files: &[PathBuf], format: ScaleFormat, max_memory: Option<&str>) -> u8 {
    let files: Vec<PathBuf> = if files.is_empty() {
        // The checkout's files; one found nowhere keeps its name for the error.
        DEFAULT_FILES
            .iter()
            .map(|f| super::checkout::checkout_path(f).unwrap_or_else(|_| PathBuf::from(f)))
            .collect()
    } else {
        files.to_vec()
    };
    let budget = match super::max_memory_option(max_memory) {
        Ok(b) => b,
        Err(code) => return code,
    };
    if let Err(code) = scale_fits(&files, &budget) {
        return code;
    }
    let report = match scale_bench(&files) {
        Ok(report) => report,
        Err(e) => {
            eprintln!("error: bench scale: {e}");
            return EXIT_BAD_INPUT;
        }
    };
    match format {
        ScaleFormat::Table => out!("{report}"),
        ScaleFormat::Json => match serde_json::to_string_pretty(&report) {
            Ok(json) => outln!("{json}"),
            Err(e) => {
                eprintln!("error: bench scale: cannot write the JSON report: {e}");
                return EXIT_BAD_INPUT;
            }
        },
    }
    if report.all_passed() {
        EXIT_OK
    } else {
        EXIT_FAILED
    }
}

/// Every case of `files` fits `budget` (one runs at a time; the memcpy
/// measurement first takes two 256 MiB buffers): the largest is stated on
/// stderr, or the first over the budget refused (exit 2).
fn scale_fits(
    files: &[PathBuf],
    budget: &crate::scenario::memory_estimate::Budget,
) -> Result<(), u8> {
    use crate::scenario::memory_estimate::human_bytes;
    let cases = match crate::bench::scale::scale_cases(files) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: bench scale: {e}");
            return Err(EXIT_BAD_INPUT);
        }
    };
    for case in &cases {
        super::pools_hold(case)?;
    }
    super::cases_fit(&cases, budget, false)?;
    let largest = cases
        .iter()
        .map(|c| crate::scenario::estimate_memory(c).peak_bytes)
        .max()
        .unwrap_or(0)
        .max(crate::bench::scale::MEMCPY_BYTES);
    if let Err(message) = budget.check("bench scale", largest, "give smaller geometry files") {
        eprintln!("error: {message}");
        return Err(EXIT_BAD_INPUT);
    }
    eprintln!(
        "bench scale: {} cases, one at a time; the largest allocates about {} (within {})",
        cases.len(),
        human_bytes(largest),
        budget.describe()
    );
    Ok(())
}
