//! kvgeom: a verification harness and descriptor-geometry fuzzer for KV-cache
//! transfers over NVIDIA NIXL.
//!
//! The [`connector`] is a Rust implementation of vLLM 0.33.0's NIXL KV
//! connector for hybrid (attention + mamba) models with heterogeneous P/D
//! block geometry. It talks to NIXL only through the [`nixl::Nixl`] trait;
//! the [`nixl::Recording`] wrapper resolves every descriptor to byte ranges
//! and the oracles check them against the memory the scenario allocated.
//!
//! # The API
//!
//! - [`geometry`]: the input model ([`geometry::Geometry`], a P/D pair of
//!   [`geometry::EngineGeometry`] over one [`geometry::ModelSpec`]), TOML
//!   loading ([`geometry::load_geometry`]) and validation.
//! - [`connector`]: the system under test. [`connector::Worker`] is one
//!   engine rank's connector; [`connector::Policy`] names every decision
//!   point where connectors differ (`Policy::default()` is kvgeom's correct
//!   connector, [`connector::NamedPolicy`] selects vLLM 0.33.0 as released).
//! - [`nixl`]: the [`nixl::Nixl`] trait the connector talks through and its
//!   transports: [`nixl::Loopback`] (in-process), [`nixl::DryRun`] (records
//!   only), `nixl::RealNixl` (feature `nixl`) and the [`nixl::Recording`]
//!   wrapper. [`memory`] holds the host and CUDA arenas they move bytes in.
//! - [`under_test`]: the connector under test, one interface
//!   ([`under_test::ConnectorUnderTest`]: place, run by batch, one
//!   [`under_test::RunRecord`] per case), one neutral record and one judge,
//!   knowing no driver protocol; kvgeom's connector
//!   ([`under_test::run_case`] on a [`scenario::Case`]). vLLM's is
//!   [`live::VllmConnector`], a recorded trace replayed
//!   [`trace::run_trace::ReplayConnector`]; SGLang's implements the same
//!   trait with its own placement and record ([`sglang::connector`]);
//!   [`driver`] is what their Python drivers share. [`scenario`]: kvgeom's run of one placed
//!   case; [`sweep`]: many cases (`sweep::plan` enumerates
//!   them, `sweep::execute` runs them, `sweep::mutants` runs them per
//!   defect, `under_test::expectations` compares a run with an expectation file).
//! - [`oracle`]: the invariants, one table ([`oracle::ORACLES`]) used by
//!   scenarios and traces; [`layout`] and [`pattern`] are the harness's own
//!   model of where every byte belongs and which byte it must hold.
//! - [`trace`]: vLLM's geometry traces: reading, replaying through the
//!   connector, diffing and checking.
//! - [`defects`] and [`variant`]: the known historical connector defects and
//!   the connector variant a case runs ([`variant::Variant`]: a policy or
//!   one defect). [`scheduler`] models vLLM's scheduler (tokens moved,
//!   blocks allocated, [`scheduler::DecodeAllocation`]).
//! - [`lifecycle`]: many requests at once on one P/D pair's shared block
//!   pools, through kvgeom's connector behind a narrow seam
//!   ([`lifecycle::LifecycleConnector`]), judged over the whole scenario;
//!   the lifecycle defect variants, scenario generation and shrinking.
//! - `generate` (feature `arbitrary`): the case and geometry generator
//!   shared by the fuzz targets and the property tests.
//!
//! # Internals
//!
//! Everything else is crate-private (`pub(crate)`): the connector's
//! planning steps, the transports' tables, the trace format's parsing
//! stages. What the `kvgeom` binary, the integration tests and the
//! examples need beyond the API is re-exported by one hidden module,
//! [`internals`]: the subcommands (`internals::cli`), the report formats
//! and the test fixtures. It is not part of the API and may change with any
//! commit. (A `pub(crate)` module cannot be re-exported as `pub`, so
//! `internals` re-exports items, and whole modules by glob.) The [`bench`]
//! module is public but hidden for the same reason: the GPU test reaches
//! `bench::vram` by that path.

#![warn(missing_docs)]

#[doc(hidden)]
pub mod bench;
// The subcommands' argument structs carry clap doc comments, which are the
// `--help` text; the module is the binary's, not part of the API.
#[allow(missing_docs)]
pub(crate) mod cli;
pub mod connector;
pub mod defects;
pub mod derive;
pub mod driver;
#[cfg(feature = "arbitrary")]
pub mod generate;
pub mod geometry;
pub mod layout;
pub mod lifecycle;
pub mod limits;
pub mod live;
pub mod memory;
pub mod nixl;
pub mod oracle;
pub mod pattern;
pub(crate) mod report;
pub mod scenario;
pub mod scheduler;
pub mod sglang;
pub mod sweep;
pub mod time_limits;
pub mod trace;
pub mod under_test;
pub mod variant;

/// What the `kvgeom` binary, the integration tests and the examples use
/// beyond the API: not part of it, and free to change with any commit.
#[doc(hidden)]
pub mod internals {
    /// The `kvgeom` subcommands; `src/main.rs` parses arguments and calls them.
    pub mod cli {
        pub use crate::cli::*;
    }
    /// Shared geometry fixtures for tests (a hybrid MLA + KDA pair).
    pub mod fixtures {
        pub use crate::geometry::fixtures::*;
    }
    /// Where conv sub-projections move between ranks of different TP sizes
    /// (the two policies), for the check against vLLM's own functions.
    pub mod conv_split {
        pub use crate::connector::conv_split::*;
        pub use crate::connector::policy::ConvSplit;
    }
    /// The live driver's result file, for the live tests.
    pub mod live {
        pub use crate::live::protocol::CaseResult;
    }
    pub use crate::report::layout_tables::layout_tables;
    pub use crate::report::sweep_report::Format;
    pub use crate::scenario::placement::SplitMix;
}
