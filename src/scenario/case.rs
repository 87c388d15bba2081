//! One case of the harness and its report.

use std::path::PathBuf;
use std::sync::Arc;

use serde::Serialize;

use crate::geometry::{Geometry, Mode};
use crate::layout::Side;
use crate::oracle::no_double_write::RedundantWrites;
use crate::oracle::Violation;
use crate::scheduler::DecodeAllocation;
use crate::variant::Variant;

/// Which transport moves the bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum TransportKind {
    /// In-process memcpy between registered host memory (no dependencies).
    Loopback,
    /// Real NIXL agents (cargo feature `nixl` and the NIXL runtime).
    Nixl,
}

/// Where the KV memory lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum MemoryKind {
    // Host memory. (Not a doc comment: clap would show it in `--help`.)
    #[allow(missing_docs)]
    Host,
    /// CUDA device memory (cargo feature `cuda` and a GPU).
    Vram,
}

/// Geometry + prompt length + local prefix hit + mode + allocation + seed, and the connector variant.
#[derive(Clone, Debug, Serialize)]
pub struct Case {
    #[serde(skip)]
    /// The P/D pair.
    pub geometry: Arc<Geometry>,
    /// The file the geometry came from, for the replay command.
    pub file: Option<PathBuf>,
    /// The prompt length N, in tokens.
    pub prompt_len: u32,
    /// D's local prefix-cache hit, in tokens.
    pub prefix_hit: u32,
    /// Pull (D reads) or push (P writes).
    pub mode: Mode,
    /// How many blocks D holds for the request.
    pub allocation: DecodeAllocation,
    /// Seed of the block placement among neighbour requests.
    pub seed: u64,
    /// The connector's policy: kvgeom's, vLLM 0.33.0's, or one defect.
    pub variant: Variant,
}

impl Case {
    /// The geometry's name.
    pub fn geometry_name(&self) -> &str {
        &self.geometry.name
    }

    /// The case as every report, message and expectations file names it:
    /// `GEOMETRY N=PROMPT h=HIT MODE ALLOCATION`.
    pub fn label(&self) -> String {
        format!("{} {}", self.geometry_name(), self.label_in_geometry())
    }

    /// [`label`](Self::label) without the geometry, for a list already
    /// grouped by geometry (a JUnit suite): `N=PROMPT h=HIT MODE ALLOCATION`.
    pub fn label_in_geometry(&self) -> String {
        format!(
            "N={} h={} {} {}",
            self.prompt_len,
            self.prefix_hit,
            self.mode,
            self.allocation.as_str()
        )
    }

    /// The command that replays this case on its own.
    pub fn replay_command(&self) -> String {
        let target = self.file.as_ref().map_or_else(
            || format!("geometries/{}.toml", self.geometry.name),
            |p| shell_word(&p.display().to_string()),
        );
        if self.geometry.stack == crate::geometry::Stack::Sglang {
            // SGLang's own transfer: push, no allocation model, no variant.
            return format!(
                "kvgeom explain --connector sglang {target} --prompt {} --seed {}",
                self.prompt_len, self.seed
            );
        }
        let mut cmd = format!(
            "kvgeom explain {target} --prompt {} --prefix-hit {} --mode {} --alloc {} --seed {}",
            self.prompt_len,
            self.prefix_hit,
            self.mode,
            self.allocation.as_str(),
            self.seed
        );
        cmd.push_str(&self.variant.cli_args());
        cmd
    }
}

/// `text` as one word of a POSIX shell command line: as it is when it
/// holds only characters no shell treats specially, else in single quotes
/// (a quote inside written `'\''`), so a printed command can be pasted.
pub fn shell_word(text: &str) -> String {
    let plain = !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_./=:,@%+-".contains(c));
    if plain {
        text.to_string()
    } else {
        format!("'{}'", text.replace('\'', "'\\''"))
    }
}

/// How a case ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Outcome {
    /// Transfers done and every oracle passed.
    Passed,
    /// Transfers done; some invariant is violated.
    Violations,
    /// The connector refused the pair loudly, as the geometry file expects.
    ExpectedRejection {
        /// The engine that refused.
        side: Side,
        /// The refusal.
        message: String,
    },
    /// The connector refused a pair it should accept (or with another message).
    UnexpectedRejection {
        /// The engine that refused.
        side: Side,
        /// The refusal.
        message: String,
    },
    /// The geometry expects a rejection but the handshake accepted the pair.
    MissingRejection {
        /// The substring the refusal should have carried.
        expected: String,
    },
    /// A planning step or the post-process failed (vLLM raises here).
    Crashed {
        /// The engine whose step failed.
        side: Side,
        /// The failure.
        message: String,
    },
    /// The request can never complete (e.g. D waits for a push that never comes).
    Hung {
        /// What never happens.
        message: String,
    },
    /// The harness itself could not run the case (bad input, missing runtime).
    Error {
        /// What went wrong.
        message: String,
    },
    /// vLLM's scheduler cannot make this case's request (a prefix hit that
    /// is not whole decode blocks, say): neither passed nor failed, counted
    /// apart (`--requests scheduler`, docs/live-vllm.md).
    NotReachable {
        /// The place phase's reason.
        reason: String,
    },
}

impl Outcome {
    /// The harness's own error `e` (never the connector's) as a case's
    /// outcome: [`Outcome::Error`] with `e`'s message.
    pub fn error(e: impl std::fmt::Display) -> Self {
        Outcome::Error {
            message: e.to_string(),
        }
    }

    /// Passed, or refused exactly as the geometry expects.
    pub fn passed(&self) -> bool {
        matches!(self, Outcome::Passed | Outcome::ExpectedRejection { .. })
    }

    /// A case vLLM's scheduler cannot make: neither passed nor failed.
    pub fn not_reachable(&self) -> bool {
        matches!(self, Outcome::NotReachable { .. })
    }

    /// The outcome's name in tables.
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Passed => "passed",
            Outcome::Violations => "violations",
            Outcome::ExpectedRejection { .. } => "expected rejection",
            Outcome::UnexpectedRejection { .. } => "unexpected rejection",
            Outcome::MissingRejection { .. } => "missing rejection",
            Outcome::Crashed { .. } => "crashed",
            Outcome::Hung { .. } => "hung",
            Outcome::Error { .. } => "error",
            Outcome::NotReachable { .. } => "not reachable",
        }
    }

    /// One line describing a non-passing outcome.
    pub fn describe(&self) -> String {
        match self {
            Outcome::Passed => "passed".into(),
            Outcome::Violations => "invariants violated".into(),
            Outcome::ExpectedRejection { side, message } => {
                format!("{side} refused as expected: {message}")
            }
            Outcome::UnexpectedRejection { side, message } => {
                format!("{side} refused the pair: {message}")
            }
            Outcome::MissingRejection { expected } => {
                format!("handshake accepted a pair that must be refused with \"{expected}\"")
            }
            Outcome::Crashed { side, message } => format!("{side} crashed: {message}"),
            Outcome::Hung { message } => format!("never completes: {message}"),
            Outcome::Error { message } => format!("harness error: {message}"),
            Outcome::NotReachable { reason } => {
                format!("not reachable by vLLM's scheduler: {reason}")
            }
        }
    }
}

/// Counts of one case.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Stats {
    /// Descriptor pairs posted.
    pub pairs: u64,
    /// Bytes the posted pairs moved.
    pub transferred_bytes: u64,
    /// Bytes the receive post-process zeroed.
    pub zeroed_bytes: u64,
    /// The case's estimated peak memory (`scenario::memory_estimate`).
    pub memory_bytes: u64,
    /// Destination bytes written again with the same content: a cost, not
    /// corruption (omitted from reports when none).
    #[serde(skip_serializing_if = "RedundantWrites::is_none")]
    pub redundant_writes: RedundantWrites,
}

/// The result of one case.
#[derive(Clone, Debug, Serialize)]
pub struct CaseReport {
    /// The case run.
    pub case: Case,
    /// How it ended.
    pub outcome: Outcome,
    /// What moved.
    pub stats: Stats,
    /// Every oracle violation found.
    pub violations: Vec<Violation>,
}

impl CaseReport {
    /// The outcome passed and no oracle found a violation.
    pub fn passed(&self) -> bool {
        self.outcome.passed() && self.violations.is_empty()
    }

    /// Failed: neither passed nor a case vLLM's scheduler cannot make
    /// (those are counted apart).
    pub fn failed(&self) -> bool {
        !self.passed() && !self.outcome.not_reachable()
    }
}

#[cfg(test)]
mod tests {
    use super::{shell_word, Case};

    #[test]
    fn a_case_is_labelled_the_same_everywhere() {
        let case = Case {
            geometry: std::sync::Arc::new(crate::geometry::fixtures::g1()),
            file: None,
            prompt_len: 13,
            prefix_hit: 4,
            mode: crate::geometry::Mode::Push,
            allocation: crate::scheduler::DecodeAllocation::Mainline,
            seed: 7,
            variant: crate::variant::Variant::KVGEOM,
        };
        let name = case.geometry_name().to_string();
        assert_eq!(case.label(), format!("{name} N=13 h=4 push mainline"));
        assert_eq!(case.label_in_geometry(), "N=13 h=4 push mainline");
    }

    #[test]
    fn a_word_a_shell_would_split_or_expand_is_quoted() {
        assert_eq!(shell_word("geometries/g1.toml"), "geometries/g1.toml");
        assert_eq!(shell_word("my dir/g1.toml"), "'my dir/g1.toml'");
        assert_eq!(shell_word("it's.toml"), "'it'\\''s.toml'");
        assert_eq!(shell_word("$HOME/x"), "'$HOME/x'");
        assert_eq!(shell_word(""), "''");
    }
}
