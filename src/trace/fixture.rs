//! Writing the project's trace fixtures: the same events as a vLLM trace,
//! without what the reader can rebuild (`rows` of dlist events, rebuilt from
//! `strided`; `src_blocks_data` inside worker geometries, equal to the first
//! local list), compacted and gzipped. Output is deterministic (sorted keys,
//! no timestamp in the gzip header) and checked by reading it back.

use std::io::Write;
use std::path::Path;

use serde_json::Value;

use super::error::{TraceError, TraceErrorKind};
use super::format::TraceEvent;
use super::reader::{decompress, parse_trace, TraceLine};

/// Sizes of one written fixture.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FixtureStats {
    /// Events kept.
    pub events: usize,
    /// Size of the source trace, in bytes (as stored, compressed or not).
    pub source_bytes: u64,
    /// Size of the written fixture, in bytes.
    pub fixture_bytes: u64,
}

/// Drop the fields a fixture does not keep from one parsed line.
pub fn strip_redundant(line: &mut Value) {
    let Some(object) = line.as_object_mut() else {
        return;
    };
    match object.get("ev").and_then(Value::as_str) {
        Some("dlist") => {
            object.remove("rows");
        }
        Some("local_geometry") | Some("request_done") => {
            if let Some(geometry) = object.get_mut("geometry").and_then(Value::as_object_mut) {
                geometry.remove("src_blocks_data");
            }
        }
        _ => {}
    }
}

/// Events as a fixture keeps them (for comparing a fixture with its source).
fn without_redundant(lines: &[TraceLine]) -> Vec<(u64, TraceEvent)> {
    lines
        .iter()
        .map(|l| {
            let mut event = l.event.clone();
            match &mut event {
                TraceEvent::LocalGeometry(g) => {
                    if let Some(geo) = &mut g.geometry {
                        geo.src_blocks_data = None;
                    }
                }
                TraceEvent::RequestDone(d) => {
                    if let Some(geo) = &mut d.geometry {
                        geo.src_blocks_data = None;
                    }
                }
                _ => {}
            }
            (l.seq, event)
        })
        .collect()
}

/// Write the fixture of trace `src` (plain or gzip) to `dst` (gzip),
/// creating `dst`'s folder. The source must read as a valid trace, and the
/// written fixture must read back to the same events.
pub fn write_fixture(src: &Path, dst: &Path) -> Result<FixtureStats, TraceError> {
    let bytes =
        std::fs::read(src).map_err(|e| TraceError::new(src, None, TraceErrorKind::Read(e)))?;
    let source = parse_trace(src, &bytes)?;
    let text = decompress(src, &bytes)?;

    let mut out = String::new();
    for (index, raw) in text.split(|&b| b == b'\n').enumerate() {
        let err = |kind| TraceError::new(src, Some(index + 1), kind);
        let raw = std::str::from_utf8(raw).map_err(|_| err(TraceErrorKind::NotUtf8))?;
        if raw.trim().is_empty() {
            continue;
        }
        let mut value: Value =
            serde_json::from_str(raw).map_err(|e| err(TraceErrorKind::BadJson(e)))?;
        strip_redundant(&mut value);
        let compact = serde_json::to_string(&value).map_err(|e| err(TraceErrorKind::BadJson(e)))?;
        out.push_str(&compact);
        out.push('\n');
    }

    let write_err = |e| TraceError::new(dst, None, TraceErrorKind::Write(e));
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    encoder.write_all(out.as_bytes()).map_err(write_err)?;
    let packed = encoder.finish().map_err(write_err)?;

    let reread = parse_trace(dst, &packed)?;
    let (want, got) = (without_redundant(&source), without_redundant(&reread));
    if want != got {
        let at = want
            .iter()
            .zip(&got)
            .position(|(a, b)| a != b)
            .unwrap_or(want.len().min(got.len()));
        return Err(TraceError::new(
            dst,
            None,
            TraceErrorKind::FixtureMismatch(format!(
                "event {at} differs ({} source events, {} fixture events)",
                want.len(),
                got.len()
            )),
        ));
    }

    if let Some(parent) = dst.parent() {
        std::fs::create_dir_all(parent).map_err(write_err)?;
    }
    std::fs::write(dst, &packed).map_err(write_err)?;
    Ok(FixtureStats {
        events: source.len(),
        source_bytes: bytes.len() as u64,
        fixture_bytes: packed.len() as u64,
    })
}
