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
pub fn bench_scale(files: &[PathBuf], format: ScaleFormat) -> u8 {
    let files: Vec<PathBuf> = if files.is_empty() {
        DEFAULT_FILES.iter().map(PathBuf::from).collect()
    } else {
        files.to_vec()
    };
    let report = match scale_bench(&files) {
        Ok(report) => report,
        Err(e) => {
            eprintln!("error: bench scale: {e}");
            return EXIT_BAD_INPUT;
        }
    };
    match format {
        ScaleFormat::Table => print!("{report}"),
        ScaleFormat::Json => match serde_json::to_string_pretty(&report) {
            Ok(json) => println!("{json}"),
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
