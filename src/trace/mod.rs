//! vLLM NIXL geometry traces. Version 2 (`kvgeom-vllm-trace/2`, one case of
//! the live driver per file) and version 3 (`kvgeom-trace/3`, what ran
//! named too) are serialised run records, read and judged as a connector
//! under test ([`run_trace`]); kvgeom's own run of a case is written as
//! one by [`write_trace`]. Version 1
//! (`vllm-nixl-geometry-trace/1`): reading them
//! into typed events ([`read_trace`], [`TraceEvent`]; [`format`](mod@format)
//! documents every event and field), extracting one case
//! ([`TraceCase`]), normalising addresses to (region, offset)
//! ([`RegionMap`]), replaying a case through kvgeom's connector
//! ([`replay`], [`diff_against_connector`]), diffing a recorded run against
//! a case ([`diff_run`]), naming the known defects that explain a
//! difference ([`explain_difference`]) and checking vLLM's own transfers with the
//! descriptor-level oracles ([`check_case`]). [`write_fixture`] writes the
//! project's compact copies of the traces; [`reissue()`] replays a case's own
//! calls through the dry-run transport; [`trace_inputs`] lists the trace
//! files a command line names, searching folders recursively.

pub(crate) mod base64;
pub(crate) mod case;
pub(crate) mod case_checks;
pub(crate) mod check;
pub(crate) mod diff;
pub(crate) mod error;
pub(crate) mod explain;
pub(crate) mod fixture;
pub mod format;
pub(crate) mod inputs;
pub(crate) mod normalize;
pub(crate) mod prefix_hit;
pub(crate) mod reader;
pub(crate) mod registration;
pub(crate) mod reissue;
pub(crate) mod replay;
pub mod run_trace;
pub(crate) mod text_file;
pub(crate) mod trace_writer;
pub(crate) mod v1_counts;
pub(crate) mod v1_fields;

pub use base64::Base64Error;
pub use case::{ExpectedDlist, ExpectedXfer, ListRole, RemoteRank, TraceCase};
pub use check::{check_case, CheckReport, SkippedCheck};
pub use diff::{diff_block_ids, diff_run, ActualRun, DiffReport, Difference, Side};
pub use error::{Disagreement, Refusal, TraceError, TraceErrorKind};
pub use explain::{explain_difference, smallest_explaining_set, Explanation};
pub use fixture::{write_fixture, FixtureStats};
pub use format::TraceEvent;
pub use inputs::{is_trace_name, is_v1_name, trace_inputs};
pub use normalize::{Location, NormRow, Region, RegionMap};
pub use reader::{decompress, parse_trace, read_trace, TraceFile, TraceLine};
pub use registration::{registration_is_modelled, NotTheTracedModel};
pub use reissue::{reissue, ReissueError, Relocation};
pub use replay::{diff_against_connector, replay, Replay, ReplayError};
pub use trace_writer::{write_trace, TraceWriteError, TRACE_FORMAT_V3};
