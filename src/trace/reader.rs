//! Reading a trace file into typed events: gzip is detected by its magic
//! bytes, each non-blank line is one JSON object with `seq` (0, 1, 2...) and
//! `ev`. A `dlist`'s rows are rebuilt from its strided runs and, when the
//! line also carries `rows`, checked against them.

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde_json::Value;

use super::error::{TraceError, TraceErrorKind};
use super::format::{DlistEvent, RawDlist, TraceEvent, EVENT_NAMES, FORMAT_NAME, LOCAL_TARGET};
use crate::limits::{read_capped, read_to_end_capped, InputError, MAX_INPUT_BYTES};
use crate::nixl::{DescList, DescRow, DlistHandle, DlistTarget, StridedRun};

/// The most rows one descriptor list may expand to (a guard against
/// corrupt counts, far above any real list).
pub const MAX_ROWS_PER_LIST: u64 = 1 << 22;

const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// One event with where it came from.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct TraceLine {
    /// 1-based line number in the (decompressed) file.
    pub line: usize,
    /// The line's `seq` number.
    pub seq: u64,
    /// The parsed event.
    pub event: TraceEvent,
}

/// A whole trace file.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct TraceFile {
    /// The file read.
    pub path: PathBuf,
    /// Its events, in file order.
    pub lines: Vec<TraceLine>,
}

/// Read and parse a `.jsonl` or `.jsonl.gz` trace.
pub fn read_trace(path: &Path) -> Result<TraceFile, TraceError> {
    let bytes = read_capped(path, MAX_INPUT_BYTES).map_err(|e| match e {
        InputError::Io { source, .. } => TraceError::new(path, None, TraceErrorKind::Read(source)),
        other => TraceError::new(path, None, TraceErrorKind::Input(other)),
    })?;
    let lines = parse_trace(path, &bytes)?;
    Ok(TraceFile {
        path: path.to_path_buf(),
        lines,
    })
}

/// The text of a trace, gunzipped when `bytes` start with the gzip magic;
/// inflating stops at [`MAX_INPUT_BYTES`]. `path` only names the source in
/// errors.
pub fn decompress(path: &Path, bytes: &[u8]) -> Result<Vec<u8>, TraceError> {
    if !bytes.starts_with(&GZIP_MAGIC) {
        return Ok(bytes.to_vec());
    }
    read_to_end_capped(
        flate2::read::MultiGzDecoder::new(bytes),
        MAX_INPUT_BYTES,
        path,
    )
    .map_err(|e| match e {
        InputError::Io { source, .. } => {
            TraceError::new(path, None, TraceErrorKind::Decompress(source))
        }
        InputError::TooLarge { limit, .. } => {
            TraceError::new(path, None, TraceErrorKind::InflatesTooLarge { limit })
        }
        other => TraceError::new(path, None, TraceErrorKind::Input(other)),
    })
}

/// Parse a trace held in memory (plain or gzip). `path` only names the
/// source in errors.
pub fn parse_trace(path: &Path, bytes: &[u8]) -> Result<Vec<TraceLine>, TraceError> {
    let text = decompress(path, bytes)?;
    let mut out = Vec::new();
    for (index, raw) in text.split(|&b| b == b'\n').enumerate() {
        let line = index + 1;
        let err = |kind| TraceError::new(path, Some(line), kind);
        let raw = std::str::from_utf8(raw).map_err(|_| err(TraceErrorKind::NotUtf8))?;
        if raw.trim().is_empty() {
            continue;
        }
        let (seq, event) = parse_line(raw).map_err(err)?;
        let expected = out.len() as u64;
        if seq != expected {
            return Err(err(TraceErrorKind::SeqOutOfOrder {
                expected,
                found: seq,
            }));
        }
        out.push(TraceLine { line, seq, event });
    }
    Ok(out)
}

/// Parse one line into its `seq` and event.
pub fn parse_line(text: &str) -> Result<(u64, TraceEvent), TraceErrorKind> {
    let value: Value = serde_json::from_str(text).map_err(TraceErrorKind::BadJson)?;
    let Value::Object(object) = &value else {
        return Err(TraceErrorKind::NotAnObject);
    };
    let seq = object
        .get("seq")
        .and_then(Value::as_u64)
        .ok_or(TraceErrorKind::BadSeq)?;
    let ev = object
        .get("ev")
        .and_then(Value::as_str)
        .ok_or(TraceErrorKind::MissingEv)?;
    let name = EVENT_NAMES
        .iter()
        .copied()
        .find(|n| *n == ev)
        .ok_or_else(|| TraceErrorKind::UnknownEvent(ev.to_string()))?;
    let event = match name {
        "meta" => {
            let meta: super::format::Meta = payload(name, value)?;
            if meta.format != FORMAT_NAME {
                return Err(TraceErrorKind::UnsupportedFormat(meta.format));
            }
            TraceEvent::Meta(meta)
        }
        "case" => TraceEvent::Case(payload(name, value)?),
        "make_worker" => TraceEvent::MakeWorker(payload(name, value)?),
        "nixl_agent" => TraceEvent::NixlAgent(payload(name, value)?),
        "register_memory" => TraceEvent::RegisterMemory(payload(name, value)?),
        "dlist" => TraceEvent::Dlist(dlist(payload(name, value)?)?),
        "local_geometry" => TraceEvent::LocalGeometry(payload(name, value)?),
        "make_remote_meta" => TraceEvent::MakeRemoteMeta(payload(name, value)?),
        "add_remote_agent" => TraceEvent::AddRemoteAgent(payload(name, value)?),
        "request" => TraceEvent::Request(payload(name, value)?),
        "xfer" => TraceEvent::Xfer(payload(name, value)?),
        "request_done" => TraceEvent::RequestDone(payload(name, value)?),
        _ => TraceEvent::Result(payload(name, value)?),
    };
    Ok((seq, event))
}

fn payload<T: DeserializeOwned>(ev: &'static str, value: Value) -> Result<T, TraceErrorKind> {
    serde_json::from_value(value).map_err(|e| TraceErrorKind::BadEvent {
        ev,
        message: e.to_string(),
    })
}

/// Build the list from its strided runs; check it against `rows` when given.
fn dlist(raw: RawDlist) -> Result<DlistEvent, TraceErrorKind> {
    let handle = raw.handle;
    let mut total: u64 = 0;
    let mut runs = Vec::with_capacity(raw.strided.len());
    for (index, &(addr, len, dev, stride, count)) in raw.strided.iter().enumerate() {
        let last_end = count
            .checked_sub(1)
            .map_or(Some(0), |k| k.checked_mul(stride))
            .and_then(|off| off.checked_add(addr))
            .and_then(|start| start.checked_add(len));
        if last_end.is_none() {
            return Err(TraceErrorKind::RunOverflow { handle, run: index });
        }
        total = total.saturating_add(count);
        if total > MAX_ROWS_PER_LIST {
            return Err(TraceErrorKind::TooManyRows {
                handle,
                rows: total,
                limit: MAX_ROWS_PER_LIST,
            });
        }
        runs.push(StridedRun {
            addr,
            len,
            dev,
            stride,
            count,
        });
    }
    let list = DescList::from_runs(runs);
    if let Some(rows) = &raw.rows {
        if rows.len() as u64 != list.len() {
            return Err(TraceErrorKind::RowCountMismatch {
                handle,
                strided: list.len(),
                rows: rows.len() as u64,
            });
        }
        for (index, (built, &(addr, len, dev))) in list.rows().zip(rows).enumerate() {
            let given = DescRow { addr, len, dev };
            if built != given {
                return Err(TraceErrorKind::RowMismatch {
                    handle,
                    row: index as u64,
                    strided: built,
                    rows: given,
                });
            }
        }
    }
    let target = if raw.target == LOCAL_TARGET {
        DlistTarget::Local
    } else {
        DlistTarget::Remote(raw.target)
    };
    Ok(DlistEvent {
        agent: raw.agent,
        handle: DlistHandle(handle),
        target,
        mem: raw.mem_type,
        list,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const DLIST: &str = r#"{"seq":0,"ev":"dlist","agent":0,"handle":7,"target":"NIXL_INIT_AGENT","mem_type":"VRAM","strided":[[100,8,0,16,3],[1000,4,1,4,1]]}"#;

    #[test]
    fn dlist_rows_are_rebuilt_from_strided_runs() {
        let (seq, event) = parse_line(DLIST).unwrap();
        assert_eq!(seq, 0);
        let TraceEvent::Dlist(d) = event else {
            panic!("not a dlist: {event:?}");
        };
        assert_eq!(d.handle, DlistHandle(7));
        assert_eq!(d.target, DlistTarget::Local);
        let rows: Vec<(u64, u64, u32)> = d.list.rows().map(|r| (r.addr, r.len, r.dev)).collect();
        assert_eq!(rows, [(100, 8, 0), (116, 8, 0), (132, 8, 0), (1000, 4, 1)]);
    }

    #[test]
    fn agreeing_rows_are_accepted_and_a_remote_target_is_kept_by_name() {
        let line = r#"{"seq":0,"ev":"dlist","agent":0,"handle":2,"target":"p-rank1","mem_type":"DRAM","strided":[[64,8,0,8,2]],"rows":[[64,8,0],[72,8,0]],"extra":true}"#;
        let TraceEvent::Dlist(d) = parse_line(line).unwrap().1 else {
            panic!("not a dlist");
        };
        assert_eq!(d.target, DlistTarget::Remote("p-rank1".into()));
        assert_eq!(d.list.len(), 2);
    }

    #[test]
    fn disagreeing_rows_name_the_row() {
        let line = r#"{"seq":0,"ev":"dlist","agent":0,"handle":2,"target":"x","mem_type":"DRAM","strided":[[64,8,0,8,2]],"rows":[[64,8,0],[73,8,0]]}"#;
        let err = parse_line(line).unwrap_err();
        assert!(
            matches!(err, TraceErrorKind::RowMismatch { handle: 2, row: 1, strided, rows }
                if strided.addr == 72 && rows.addr == 73),
            "{err:?}"
        );
        let short = r#"{"seq":0,"ev":"dlist","agent":0,"handle":2,"target":"x","mem_type":"DRAM","strided":[[64,8,0,8,2]],"rows":[[64,8,0]]}"#;
        assert!(matches!(
            parse_line(short).unwrap_err(),
            TraceErrorKind::RowCountMismatch {
                handle: 2,
                strided: 2,
                rows: 1
            }
        ));
    }

    #[test]
    fn overflowing_or_huge_runs_are_rejected() {
        let overflow = r#"{"seq":0,"ev":"dlist","agent":0,"handle":3,"target":"x","mem_type":"DRAM","strided":[[18446744073709551000,8,0,512,4]]}"#;
        assert!(matches!(
            parse_line(overflow).unwrap_err(),
            TraceErrorKind::RunOverflow { handle: 3, run: 0 }
        ));
        let huge = r#"{"seq":0,"ev":"dlist","agent":0,"handle":3,"target":"x","mem_type":"DRAM","strided":[[0,1,0,0,4194305]]}"#;
        assert!(matches!(
            parse_line(huge).unwrap_err(),
            TraceErrorKind::TooManyRows {
                handle: 3,
                rows: 4194305,
                ..
            }
        ));
    }

    #[test]
    fn bad_lines_give_typed_errors() {
        assert!(matches!(
            parse_line("{\"seq\":0,"),
            Err(TraceErrorKind::BadJson(_))
        ));
        assert!(matches!(
            parse_line("[1]"),
            Err(TraceErrorKind::NotAnObject)
        ));
        assert!(matches!(
            parse_line(r#"{"ev":"meta"}"#),
            Err(TraceErrorKind::BadSeq)
        ));
        assert!(matches!(
            parse_line(r#"{"seq":0}"#),
            Err(TraceErrorKind::MissingEv)
        ));
        assert!(matches!(
            parse_line(r#"{"seq":0,"ev":"teleport"}"#),
            Err(TraceErrorKind::UnknownEvent(ev)) if ev == "teleport"
        ));
        let missing = parse_line(r#"{"seq":0,"ev":"xfer","agent":0}"#).unwrap_err();
        assert!(
            matches!(&missing, TraceErrorKind::BadEvent { ev: "xfer", message } if message.contains("handle")),
            "{missing:?}"
        );
        let format =
            r#"{"seq":0,"ev":"meta","format":"other/2","nodeid":"n","test":"t","vllm":"0"}"#;
        assert!(matches!(
            parse_line(format),
            Err(TraceErrorKind::UnsupportedFormat(f)) if f == "other/2"
        ));
    }

    #[test]
    fn seq_must_count_events_and_errors_carry_the_line() {
        let text = "{\"seq\":0,\"ev\":\"result\",\"outcome\":\"passed\"}\n\n{\"seq\":2,\"ev\":\"result\",\"outcome\":\"passed\"}\n";
        let err = parse_trace(Path::new("t.jsonl"), text.as_bytes()).unwrap_err();
        assert_eq!(err.line, Some(3));
        assert!(matches!(
            err.kind,
            TraceErrorKind::SeqOutOfOrder {
                expected: 1,
                found: 2
            }
        ));
        assert_eq!(
            err.to_string(),
            "t.jsonl:3: out of order: seq 2 where 1 was expected"
        );
    }

    #[test]
    fn gzip_is_detected_by_magic_bytes() {
        use std::io::Write;
        let text = "{\"seq\":0,\"ev\":\"result\",\"outcome\":\"passed\",\"duration_s\":0.5}\n";
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        enc.write_all(text.as_bytes()).unwrap();
        let gz = enc.finish().unwrap();
        let plain = parse_trace(Path::new("a"), text.as_bytes()).unwrap();
        let packed = parse_trace(Path::new("a"), &gz).unwrap();
        assert_eq!(plain, packed);
        assert_eq!(packed.len(), 1);
        let err = parse_trace(Path::new("a"), &gz[..gz.len() / 2]).unwrap_err();
        assert!(matches!(err.kind, TraceErrorKind::Decompress(_)), "{err:?}");
    }
}
