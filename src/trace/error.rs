//! The one error type of the trace module: which file, which line (1-based,
//! when the problem belongs to one line) and what is wrong.

use std::fmt;
use std::path::PathBuf;

use crate::nixl::DescRow;

/// A trace could not be read, understood or written.
#[derive(Debug, thiserror::Error)]
pub struct TraceError {
    /// The trace or fixture file.
    pub path: PathBuf,
    /// 1-based line number of the offending line, when there is one.
    pub line: Option<usize>,
    /// What is wrong.
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
    /// The file cannot be read.
    #[error("cannot read: {0}")]
    Read(#[source] std::io::Error),
    /// The file cannot be written.
    #[error("cannot write: {0}")]
    Write(#[source] std::io::Error),
    /// The file is not a regular file, or larger than the input limit.
    #[error("{}", .0.reason())]
    Input(crate::limits::InputError),
    /// A `.gz` file whose stream does not inflate.
    #[error("gzip stream is corrupt: {0}")]
    Decompress(#[source] std::io::Error),
    /// A line with bytes that are not UTF-8.
    #[error("line is not UTF-8")]
    NotUtf8,
    /// A line that does not parse as JSON.
    #[error("not valid JSON: {0}")]
    BadJson(#[source] serde_json::Error),
    /// A line that is JSON but not an object.
    #[error("a trace line must be a JSON object")]
    NotAnObject,
    /// A line without a usable `seq`.
    #[error("field `seq` is missing or not a non-negative integer")]
    BadSeq,
    /// Lines whose `seq` numbers do not count up by one.
    #[error("out of order: seq {found} where {expected} was expected")]
    SeqOutOfOrder {
        /// The `seq` the line should have.
        expected: u64,
        /// The `seq` it has.
        found: u64,
    },
    /// A line without a usable `ev`.
    #[error("field `ev` is missing or not a string")]
    MissingEv,
    /// An `ev` the format does not define.
    #[error("unknown event `ev: {0}`")]
    UnknownEvent(String),
    /// A known event whose fields do not fit it.
    #[error("bad `{ev}` event: {message}")]
    BadEvent {
        /// The event name.
        ev: &'static str,
        /// What is wrong with its fields.
        message: String,
    },
    /// A `header` naming another format (the name given).
    #[error("unsupported trace format `{0}` (expected `{expected}`)", expected = super::format::FORMAT_NAME)]
    UnsupportedFormat(String),
    /// A strided run whose last row would pass `u64::MAX`.
    #[error("dlist handle {handle}: strided run {run} overflows the 64-bit address space")]
    RunOverflow {
        /// The dlist's handle in the trace.
        handle: u64,
        /// The run's index in the list.
        run: usize,
    },
    /// A list too long to expand.
    #[error("dlist handle {handle}: {rows} rows exceed the limit of {limit}")]
    TooManyRows {
        /// The dlist's handle in the trace.
        handle: u64,
        /// Rows the list expands to.
        rows: u64,
        /// The most allowed.
        limit: u64,
    },
    /// A list whose `strided` and `rows` forms differ in length.
    #[error("dlist handle {handle}: `strided` expands to {strided} rows but `rows` has {rows}")]
    RowCountMismatch {
        /// The dlist's handle in the trace.
        handle: u64,
        /// Rows the `strided` form expands to.
        strided: u64,
        /// Rows of the `rows` form.
        rows: u64,
    },
    /// A list whose `strided` and `rows` forms differ in one row.
    #[error(
        "dlist handle {handle} row {row}: `strided` gives ({}, {}, dev {}) but `rows` has ({}, {}, dev {})",
        strided.addr, strided.len, strided.dev, rows.addr, rows.len, rows.dev
    )]
    RowMismatch {
        /// The dlist's handle in the trace.
        handle: u64,
        /// The row's id.
        row: u64,
        /// The row as the `strided` form gives it.
        strided: DescRow,
        /// The row as the `rows` form gives it.
        rows: DescRow,
    },
    /// A required event (named) is absent.
    #[error("no `{0}` event")]
    MissingEvent(&'static str),
    /// A once-only event (named) appears twice.
    #[error("a second `{0}` event (only one is supported)")]
    DuplicateEvent(&'static str),
    /// Events of more than one agent in one trace.
    #[error("event of agent {found}, but the trace's worker is agent {expected} (one worker per trace is supported)")]
    SeveralAgents {
        /// The trace's worker agent (the first seen).
        expected: u32,
        /// The other agent.
        found: u32,
    },
    /// A dlist handle prepared twice (the handle).
    #[error("dlist handle {0} is prepared twice")]
    DuplicateHandle(u64),
    /// A transfer naming a handle no earlier dlist prepared.
    #[error("xfer refers to {side} handle {handle}, which no earlier dlist prepared")]
    UnknownHandle {
        /// `local` or `remote`.
        side: &'static str,
        /// The handle.
        handle: u64,
    },
    /// A dlist against a remote agent the trace never loaded.
    #[error(
        "dlist handle {handle} targets remote agent `{target}`, which no add_remote_agent names"
    )]
    UnknownRemote {
        /// The dlist's handle in the trace.
        handle: u64,
        /// The remote agent's name.
        target: String,
    },
    /// A gzip stream that inflates past the input limit.
    #[error("larger than the input limit of {limit} bytes once decompressed")]
    InflatesTooLarge {
        /// The limit, in bytes ([`crate::limits::MAX_INPUT_BYTES`]).
        limit: u64,
    },
    /// A field that must be at least 1 (a block size, TP size or blocks
    /// per block ratio) is 0.
    #[error("`{ev}` field `{field}` is 0; it must be at least 1")]
    ZeroField {
        /// The event.
        ev: &'static str,
        /// The field.
        field: &'static str,
    },
    /// A number too large for the field it fills (a block id or count in a
    /// 32-bit field, a TP size above the limit).
    #[error("`{ev}` field `{field}`: {value} exceeds the largest allowed value {limit}")]
    OutOfRange {
        /// The event.
        ev: &'static str,
        /// The field.
        field: &'static str,
        /// The value given.
        value: u64,
        /// The largest value allowed.
        limit: u64,
    },
    /// A request block id outside its side's pool.
    #[error(
        "`request` field `{field}`: block {id} is outside the pool of {blocks} logical blocks"
    )]
    BlockOutOfPool {
        /// `local_block_ids` or `remote_block_ids`.
        field: &'static str,
        /// The block id.
        id: u64,
        /// Logical blocks in that side's pool.
        blocks: u64,
    },
    /// A field whose value would change the verdict in a way kvgeom does
    /// not model: the trace is refused, with the way forward.
    #[error("{0}")]
    NotModelled(Box<Refusal>),
    /// A field whose value contradicts another of the same trace (a count
    /// the blocks cannot hold, two fields that must agree and do not).
    #[error("{0}")]
    Inconsistent(Box<Disagreement>),
    /// A folder holding no `*.jsonl` or `*.jsonl.gz` trace, at any depth.
    #[error("no *.jsonl or *.jsonl.gz trace files in this folder or its subfolders")]
    EmptyFolder,
    /// A fixture that no longer matches the trace it was made from (the first difference).
    #[error("fixture differs from its source: {0}")]
    FixtureMismatch(String),
}

/// A v1 field kvgeom does not model at its value (docs/trace-format.md, "v1 fields").
#[derive(Debug, thiserror::Error)]
#[error("refused: `{ev}` field `{field}` is {value}: {why}; {instead}")]
pub struct Refusal {
    /// The event.
    pub ev: &'static str,
    /// The field, as a dotted path inside the event.
    pub field: String,
    /// Its value, as JSON.
    pub value: String,
    /// What kvgeom does not model.
    pub why: String,
    /// What to do instead.
    pub instead: String,
}

/// A v1 field that disagrees with the rest of its trace.
#[derive(Debug, thiserror::Error)]
#[error("`{ev}` field `{field}` is {value}, but {expected}")]
pub struct Disagreement {
    /// The event.
    pub ev: &'static str,
    /// The field, as a dotted path inside the event.
    pub field: String,
    /// Its value, as JSON.
    pub value: String,
    /// What the rest of the trace requires.
    pub expected: String,
}

impl TraceErrorKind {
    /// The event a refusal or disagreement belongs to.
    pub fn field_event(&self) -> Option<&'static str> {
        match self {
            TraceErrorKind::NotModelled(r) => Some(r.ev),
            TraceErrorKind::Inconsistent(d) => Some(d.ev),
            _ => None,
        }
    }
}

impl TraceError {
    /// An error of `kind` in `path`, at `line` when it belongs to one.
    pub fn new(path: impl Into<PathBuf>, line: Option<usize>, kind: TraceErrorKind) -> Self {
        Self {
            path: path.into(),
            line,
            kind,
        }
    }
}
