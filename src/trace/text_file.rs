//! Writing a trace's text to a file, gzipped when the name ends in `.gz`
//! (the reader's [`super::reader::decompress`] reads both back).

use std::io::Write;
use std::path::Path;

/// Write `text` at `path` and sync it; gzipped when `path` ends in `.gz`.
pub(crate) fn write_trace_text(path: &Path, text: &str) -> std::io::Result<()> {
    let file = std::fs::File::create(path)?;
    if path.extension().is_some_and(|e| e == "gz") {
        let mut gz = flate2::write::GzEncoder::new(file, flate2::Compression::default());
        gz.write_all(text.as_bytes())?;
        gz.finish()?.sync_all()
    } else {
        let mut file = file;
        file.write_all(text.as_bytes())?;
        file.sync_all()
    }
}
