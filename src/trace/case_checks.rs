//! Reading a v1 trace into its case: the events extracted (`case.rs`),
//! the model refused when it is not the one the reader rebuilds (MLA, the
//! attention group first), then its counts checked against each other (`v1_counts.rs`) and the
//! fields kvgeom does not model at their value refused (`v1_fields.rs`);
//! either is an error of the file naming the event's line and the field.

use std::path::Path;

use super::case::TraceCase;
use super::error::{TraceError, TraceErrorKind};
use super::reader::{read_trace, TraceFile, TraceLine};
use super::v1_counts::check_counts;
use super::v1_fields::{refuse_unmodelled, refuse_unmodelled_model};

impl TraceCase {
    /// Read a `.jsonl` or `.jsonl.gz` trace and extract its case.
    pub fn read(path: &Path) -> Result<Self, TraceError> {
        Self::from_file(&read_trace(path)?)
    }

    /// Extract the case from parsed lines.
    pub fn from_file(file: &TraceFile) -> Result<Self, TraceError> {
        Self::from_lines(&file.path, &file.lines)
    }

    /// Extract the case from lines read from `path`; its model must be the
    /// reader's, its counts must agree and every field must be one kvgeom
    /// models at its value.
    pub fn from_lines(path: &Path, lines: &[TraceLine]) -> Result<Self, TraceError> {
        let case = Self::extract(path, lines)?;
        let at_event = |kind: TraceErrorKind| {
            let line = kind
                .field_event()
                .and_then(|ev| case.event_lines.get(ev).copied());
            TraceError::new(path, line, kind)
        };
        refuse_unmodelled_model(&case).map_err(at_event)?;
        check_counts(&case).map_err(at_event)?;
        refuse_unmodelled(&case).map_err(at_event)?;
        Ok(case)
    }
}
