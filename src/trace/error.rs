//! The one error type of the trace module: which file, which line (1-based,
//! when the problem belongs to one line) and what is wrong.

use std::fmt;
use std::path::PathBuf;

use crate::nixl::DescRow;

/// A trace could not be read, understood or written.
#[derive(Debug, thiserror::Error)]
pub struct TraceError {
    pub path: PathBuf,
    /// 1-based line number of the offending line, when there is one.
    pub line: Option<usize>,
    pub kind: TraceErrorKind,
}

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "{}:{line}: {}", self.path.display(), self.kind),
            None => write!(f, "{}: {}", self.path.display(), self.kind),
        }
    }
}

/// What is wrong.
#[derive(Debug, thiserror::Error)]
pub enum TraceErrorKind {
    #[error("cannot read: {0}")]
    Read(std::io::Error),
    #[error("cannot write: {0}")]
    Write(std::io::Error),
    #[error("{}", .0.reason())]
    Input(crate::limits::InputError),
    #[error("gzip stream is corrupt: {0}")]
    Decompress(std::io::Error),
    #[error("line is not UTF-8")]
    NotUtf8,
    #[error("not valid JSON: {0}")]
    BadJson(String),
    #[error("a trace line must be a JSON object")]
    NotAnObject,
    #[error("field `seq` is missing or not a non-negative integer")]
    BadSeq,
    #[error("out of order: seq {found} where {expected} was expected")]
    SeqOutOfOrder { expected: u64, found: u64 },
    #[error("field `ev` is missing or not a string")]
    MissingEv,
    #[error("unknown event `ev: {0}`")]
    UnknownEvent(String),
    #[error("bad `{ev}` event: {message}")]
    BadEvent { ev: &'static str, message: String },
    #[error("unsupported trace format `{0}` (expected `{expected}`)", expected = super::format::FORMAT_NAME)]
    UnsupportedFormat(String),
    #[error("dlist handle {handle}: strided run {run} overflows the 64-bit address space")]
    RunOverflow { handle: u64, run: usize },
    #[error("dlist handle {handle}: {rows} rows exceed the limit of {limit}")]
    TooManyRows { handle: u64, rows: u64, limit: u64 },
    #[error("dlist handle {handle}: `strided` expands to {strided} rows but `rows` has {rows}")]
    RowCountMismatch {
        handle: u64,
        strided: u64,
        rows: u64,
    },
    #[error(
        "dlist handle {handle} row {row}: `strided` gives ({}, {}, dev {}) but `rows` has ({}, {}, dev {})",
        strided.addr, strided.len, strided.dev, rows.addr, rows.len, rows.dev
    )]
    RowMismatch {
        handle: u64,
        row: u64,
        strided: DescRow,
        rows: DescRow,
    },
    #[error("no `{0}` event")]
    MissingEvent(&'static str),
    #[error("a second `{0}` event (only one is supported)")]
    DuplicateEvent(&'static str),
    #[error("event of agent {found}, but the trace's worker is agent {expected} (one worker per trace is supported)")]
    SeveralAgents { expected: u32, found: u32 },
    #[error("dlist handle {0} is prepared twice")]
    DuplicateHandle(u64),
    #[error("xfer refers to {side} handle {handle}, which no earlier dlist prepared")]
    UnknownHandle { side: &'static str, handle: u64 },
    #[error(
        "dlist handle {handle} targets remote agent `{target}`, which no add_remote_agent names"
    )]
    UnknownRemote { handle: u64, target: String },
    #[error("fixture differs from its source: {0}")]
    FixtureMismatch(String),
}

impl TraceError {
    pub fn new(path: impl Into<PathBuf>, line: Option<usize>, kind: TraceErrorKind) -> Self {
        Self {
            path: path.into(),
            line,
            kind,
        }
    }
}
