//! Recording traces (docs/trace-format.md) from a live sweep: the driver
//! writes each case's v2 `trace.json` and, for a pull case, one v1
//! `trace.v1.d<rank>.jsonl` per decode rank; kvgeom saves them, gzipped and
//! named by their case, before the scratch folder goes.

use std::path::Path;

use crate::scenario::Case;

use super::error::BatchError;
use crate::driver::{trace_file_name, v1_trace_file_name};

/// Copy each case's `trace.json` (the driver writes one per case it ran,
/// in its folder `case_dirs[i]` of the batch folder `dir`) into `to`,
/// gzipped, under [`trace_file_name`], and its v1 traces, one per decode
/// rank, under [`v1_trace_file_name`]. Cases without v1 traces (push)
/// are counted on stderr, the first with the driver's reason.
pub(crate) fn save_traces(
    dir: &Path,
    cases: &[Case],
    case_dirs: &[Option<&str>],
    to: &Path,
) -> Result<(), BatchError> {
    use std::io::Write;
    std::fs::create_dir_all(to).map_err(|source| BatchError::CreateDir {
        path: to.to_path_buf(),
        source,
    })?;
    let save = |text: &[u8], path: std::path::PathBuf| -> Result<(), BatchError> {
        let write = |path: &Path| -> std::io::Result<()> {
            let file = std::fs::File::create(path)?;
            let mut gz = flate2::write::GzEncoder::new(file, flate2::Compression::best());
            gz.write_all(text)?;
            gz.finish()?.sync_all()
        };
        write(&path).map_err(|source| BatchError::Write { path, source })
    };
    let mut skipped = Vec::new();
    for (case, case_dir) in cases.iter().zip(case_dirs) {
        let Some(case_dir) = case_dir else { continue };
        let case_dir = dir.join(case_dir);
        let Ok(text) = std::fs::read(case_dir.join("trace.json")) else {
            continue;
        };
        save(&text, to.join(format!("{}.gz", trace_file_name(case))))?;
        for rank in 0..case.geometry.decode.tp_size {
            if let Ok(text) = std::fs::read(case_dir.join(format!("trace.v1.d{rank}.jsonl"))) {
                save(
                    &text,
                    to.join(format!("{}.gz", v1_trace_file_name(case, rank))),
                )?;
            }
        }
        if let Ok(why) = std::fs::read_to_string(case_dir.join("trace.v1.skipped")) {
            skipped.push(format!("{}: {}", trace_file_name(case), why.trim()));
        }
    }
    if let Some(first) = skipped.first() {
        eprintln!(
            "note: {} of the recorded cases have no v1 trace (e.g. {first})",
            skipped.len()
        );
    }
    Ok(())
}
