//! The commands behind the `kvgeom` binary. Each returns the process exit
//! status: 0 when everything passed, 1 when an invariant is violated (or a
//! defect is missed, or a trace differs), 2 on bad input.

mod bench;
mod derive;
mod explain;
mod layout;
mod mutants;
mod sweep;
mod traces;

pub use bench::{bench, bench_peer, bench_vram, BenchKind, OpArg, VramArgs};
pub use derive::{derive, DeriveArgs, DeriveFormat};
pub use explain::{explain, ExplainArgs};
pub use layout::layout;
pub use mutants::{defects, mutants};
pub use sweep::{sweep, SweepArgs};
pub use traces::{check_trace, diff_trace};

use crate::defects::Defect;

/// Everything passed.
pub const EXIT_OK: u8 = 0;
/// An invariant is violated (or a defect missed, or a trace differs).
pub const EXIT_FAILED: u8 = 1;
/// Bad input: unreadable or malformed files, unknown names, missing runtime.
pub const EXIT_BAD_INPUT: u8 = 2;

/// Parse `--defect NAME`, printing the known names when it is unknown.
pub(crate) fn parse_defect(name: Option<&str>) -> Result<Option<Defect>, u8> {
    match name {
        None => Ok(None),
        Some(n) => Defect::from_name(n).map(Some).ok_or_else(|| {
            eprintln!("error: unknown defect `{n}`; known defects:");
            for d in Defect::ALL {
                eprintln!("  {}", d.name());
            }
            EXIT_BAD_INPUT
        }),
    }
}

/// The default geometry folder when no path is given.
pub(crate) fn default_paths(paths: Vec<std::path::PathBuf>) -> Vec<std::path::PathBuf> {
    if paths.is_empty() {
        vec![std::path::PathBuf::from("geometries")]
    } else {
        paths
    }
}
