//! [`GeneratedCase`]: one drawn scenario and what is expected of it, and
//! [`GeneratedCase::check`], which runs it and reports any mismatch as a
//! [`Finding`].

use std::fmt;
use std::sync::Arc;

use arbitrary::{Arbitrary, Result, Unstructured};

use crate::defects::Defect;
use crate::geometry::{
    parse_geometry, to_toml, validate, Geometry, GeometryError, Mode, Violation,
};
use crate::scenario::{Case, CaseReport, Outcome, RunOptions};
use crate::scheduler::DecodeAllocation;
use crate::under_test::run_case;
use crate::variant::Variant;

use super::invalid::Refusal;

/// One drawn case in this many is deliberately invalid (half of those break
/// a geometry rule, half are pairs the handshake must refuse).
pub const INVALID_ONE_IN: u32 = 16;

/// What a generated case must do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expected {
    /// The connector accepts the pair and every oracle passes.
    Pass,
    /// Geometry validation refuses the geometry with exactly this violation.
    Invalid(Violation),
    /// The handshake refuses the pair with this refusal's message.
    Refused(Refusal),
}

/// A P/D geometry, one request on it and the expected outcome.
#[derive(Clone, PartialEq, Eq)]
pub struct GeneratedCase {
    /// The P/D pair.
    pub geometry: Geometry,
    /// The prompt length N, in tokens.
    pub prompt_len: u32,
    /// D's local prefix-cache hit, in tokens.
    pub prefix_hit: u32,
    /// Pull or push.
    pub mode: Mode,
    /// How many blocks D holds for the request.
    pub allocation: DecodeAllocation,
    /// Seed of the block placement.
    pub seed: u64,
    /// What the connector and the oracles must make of it.
    pub expected: Expected,
}

/// A generated case that did not behave as expected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    /// One line: what went wrong.
    pub summary: String,
    /// The oracle violations or errors behind it, one per line.
    pub details: Vec<String>,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.summary)?;
        for line in &self.details {
            write!(f, "\n  {line}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Finding {}

/// Violations listed in a finding, at most.
const MAX_LISTED: usize = 8;

impl GeneratedCase {
    /// The case drawn from `bytes`, as cargo-fuzz draws it (all of `bytes`
    /// is used; short input yields the smallest choices).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        Self::arbitrary_take_rest(Unstructured::new(bytes))
    }

    /// The scenario case, with the connector replaced by `defect` if given.
    pub fn case(&self, defect: Option<Defect>) -> Case {
        Case {
            geometry: Arc::new(self.geometry.clone()),
            file: None,
            prompt_len: self.prompt_len,
            prefix_hit: self.prefix_hit,
            mode: self.mode,
            allocation: self.allocation,
            seed: self.seed,
            variant: defect.map_or(Variant::KVGEOM, Variant::Defect),
        }
    }

    /// Run the case (on the loopback transport, host memory) and compare
    /// with what is expected. `Err` describes the mismatch: a violated
    /// oracle, an unexpected outcome, or a missing or wrong rejection.
    pub fn check(&self, defect: Option<Defect>) -> std::result::Result<(), Finding> {
        match &self.expected {
            Expected::Invalid(violation) => self.check_invalid(violation),
            Expected::Pass | Expected::Refused(_) => {
                let report = run_case(&self.case(defect), &RunOptions::default());
                self.check_report(&report)
            }
        }
    }

    /// Judge a report of this case (from [`run_case`] or `run_case_detailed`).
    pub fn check_report(&self, report: &CaseReport) -> std::result::Result<(), Finding> {
        let ok = match (&self.expected, &report.outcome) {
            (Expected::Pass, Outcome::Passed) => report.violations.is_empty(),
            (Expected::Refused(_), Outcome::ExpectedRejection { .. }) => true,
            _ => false,
        };
        if ok {
            return Ok(());
        }
        let expected = match &self.expected {
            Expected::Pass => "every oracle to pass".to_string(),
            Expected::Refused(r) => format!("a handshake refusal containing \"{}\"", r.message()),
            Expected::Invalid(v) => format!("the geometry error `{v}`"),
        };
        let mut details: Vec<String> = report
            .violations
            .iter()
            .take(MAX_LISTED)
            .map(|v| format!("{}: {}", v.oracle, v.message))
            .collect();
        if report.violations.len() > MAX_LISTED {
            details.push(format!(
                "... and {} more violations",
                report.violations.len() - MAX_LISTED
            ));
        }
        Err(Finding {
            summary: format!(
                "expected {expected}, got: {} ({})",
                report.outcome.describe(),
                report.outcome.label()
            ),
            details,
        })
    }

    /// An invalid geometry must fail validation with exactly `expected`,
    /// both directly and through the TOML loader.
    fn check_invalid(&self, expected: &Violation) -> std::result::Result<(), Finding> {
        let mismatch = |what: &str, found: String| Finding {
            summary: format!("{what}: expected `{expected}`, got {found}"),
            details: Vec::new(),
        };
        match validate(&self.geometry) {
            Err(v) if &v == expected => {}
            Err(v) => return Err(mismatch("validation", format!("`{v}`"))),
            Ok(()) => return Err(mismatch("validation", "no error".into())),
        }
        match parse_geometry("generated.toml", &to_toml(&self.geometry)) {
            Err(GeometryError::Invalid { field, rule, .. })
                if field == expected.field && rule == expected.rule =>
            {
                Ok(())
            }
            Err(e) => Err(mismatch("TOML loader", format!("`{e}`"))),
            Ok(_) => Err(mismatch("TOML loader", "a geometry".into())),
        }
    }
}

impl fmt::Debug for GeneratedCase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let expected = match &self.expected {
            Expected::Pass => "every oracle passes".to_string(),
            Expected::Invalid(v) => format!("invalid geometry: {v}"),
            Expected::Refused(r) => format!("handshake refusal ({r:?})"),
        };
        writeln!(
            f,
            "GeneratedCase {{ mode: {}, prompt_len: {}, prefix_hit: {}, allocation: {}, seed: {}, expected: {expected} }}",
            self.mode,
            self.prompt_len,
            self.prefix_hit,
            self.allocation.as_str(),
            self.seed,
        )?;
        writeln!(f, "--- geometry (save as generated.toml) ---")?;
        write!(f, "{}", to_toml(&self.geometry))?;
        write!(
            f,
            "--- replay: kvgeom explain generated.toml --prompt {} --prefix-hit {} --mode {} --alloc {} --seed {}",
            self.prompt_len,
            self.prefix_hit,
            self.mode,
            self.allocation.as_str(),
            self.seed
        )
    }
}
