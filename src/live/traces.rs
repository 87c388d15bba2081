//! Recording v2 traces (docs/trace-format.md) from a live sweep: the
//! driver writes each case's `trace.json`; kvgeom saves them, gzipped and
//! named by their case, before the scratch folder goes.

use std::path::Path;

use crate::scenario::Case;

use super::error::BatchError;

/// A recorded trace embeds the memory images of a case whose initial
/// memory (every region of every rank) holds at most this many bytes.
pub const TRACE_MEMORY_LIMIT: u64 = 1 << 20;

/// The name a saved trace gets: geometry, mode, prompt, prefix hit,
/// allocation and seed.
pub fn trace_file_name(case: &Case) -> String {
    format!(
        "{}-{}-n{}-hit{}-{}-s{}.trace.json",
        case.geometry_name(),
        case.mode,
        case.prompt_len,
        case.prefix_hit,
        case.allocation.as_str(),
        case.seed
    )
}

/// Copy each case's `trace.json` (the driver writes one per case it ran,
/// in its folder `case_dirs[i]` of the batch folder `dir`) into `to`,
/// gzipped, under [`trace_file_name`].
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
    for (case, case_dir) in cases.iter().zip(case_dirs) {
        let Some(case_dir) = case_dir else { continue };
        let Ok(text) = std::fs::read(dir.join(case_dir).join("trace.json")) else {
            continue;
        };
        let path = to.join(format!("{}.gz", trace_file_name(case)));
        let write = |path: &Path| -> std::io::Result<()> {
            let file = std::fs::File::create(path)?;
            let mut gz = flate2::write::GzEncoder::new(file, flate2::Compression::best());
            gz.write_all(&text)?;
            gz.finish()?.sync_all()
        };
        write(&path).map_err(|source| BatchError::Write { path, source })?;
    }
    Ok(())
}
