//! Expected failures: a TOML file listing, per geometry, mode, allocation
//! and case pattern, the outcome (and oracles) a connector is known to
//! produce. `expected/vllm-0.33.0.toml` is the one list of what vLLM 0.33.0
//! gets wrong on `geometries/`; a sweep checked against it passes when
//! exactly the listed cases fail, each the listed way, and every other case
//! passes.

use std::collections::BTreeSet;
use std::path::Path;

use serde::Deserialize;

use crate::limits::{read_text_capped, MAX_INPUT_BYTES};
use crate::scenario::prompt_list::{parse_prompt_list, PromptListError};
use crate::scenario::{Case, CaseReport};

/// An expectations file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ExpectationsError {
    #[error("{file}: {}", source.reason())]
    /// The file cannot be read, is not a regular file, or is above the
    /// input limit.
    Read {
        /// The expectations file.
        file: String,
        /// Why it cannot be read.
        source: crate::limits::InputError,
    },
    #[error("{file}: {}", source.to_string().trim_end())]
    /// The file is not valid TOML of the expected shape.
    Parse {
        /// The expectations file.
        file: String,
        /// The parser's error.
        source: toml::de::Error,
    },
    #[error("{file}: failure #{index} ({geometry}): {why}")]
    /// One `[[failure]]` entry is inconsistent.
    Entry {
        /// The expectations file.
        file: String,
        /// The entry's position, from 1.
        index: usize,
        /// The geometry the entry names.
        geometry: String,
        /// What is wrong with it.
        why: String,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileToml {
    #[serde(default)]
    failure: Vec<EntryToml>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EntryToml {
    geometry: String,
    mode: Option<String>,
    alloc: Option<String>,
    cases: CasesToml,
    outcome: String,
    oracles: Option<Vec<String>>,
    message: Option<String>,
    finding: String,
}

/// An entry's `cases` as written: `"all"` or a list of `PROMPTS/HIT`.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum CasesToml {
    All(String),
    List(Vec<String>),
}

/// A key of an entry whose value is none of its choices.
#[derive(Debug, thiserror::Error)]
#[error("{key} `{value}`: expected {}", choices.join(" or "))]
pub struct ChoiceError {
    /// The key.
    pub key: &'static str,
    /// Its value.
    pub value: String,
    /// What it may be.
    pub choices: &'static [&'static str],
}

/// `Err` naming `key` and the choices when `value` is none of them.
pub(crate) fn check_choice(
    key: &'static str,
    value: Option<&str>,
    choices: &'static [&'static str],
) -> Result<(), ChoiceError> {
    match value {
        Some(v) if !choices.contains(&v) => Err(ChoiceError {
            key,
            value: v.to_string(),
            choices,
        }),
        _ => Ok(()),
    }
}

/// What is wrong with an entry's `cases`.
#[derive(Debug, thiserror::Error)]
pub enum CasePatternError {
    /// A string other than `"all"`.
    #[error("cases `{0}`: expected \"all\" or a list like [\"1..=8/0\", \"33/16\"]")]
    NotAll(String),
    /// An item without its `/HIT`.
    #[error("case `{0}`: expected PROMPTS/HIT, e.g. `33/16`")]
    NoHit(String),
    /// A hit that is neither a number nor `*`.
    #[error("case `{item}`: `{hit}` is not a prefix hit")]
    BadHit {
        /// The item.
        item: String,
        /// Its hit.
        hit: String,
    },
    /// A prompt list that does not parse.
    #[error("case `{item}`: {source}")]
    BadPrompts {
        /// The item.
        item: String,
        /// Why its prompts do not parse.
        source: PromptListError,
    },
}

/// Which cases of a geometry an entry covers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CasePattern {
    /// Every case of the geometry in the entry's mode and allocation.
    All,
    /// `(prompt length, prefix hit)` pairs; a hit of `None` matches any.
    Listed(BTreeSet<(u32, Option<u32>)>),
}

impl CasePattern {
    /// An entry's `cases`: `"all"`, or `PROMPTS/HIT` items where PROMPTS is
    /// a prompt list (`1..=8`, `13,25`) and HIT a prefix hit or `*` (any);
    /// `Err` says what is wrong with it.
    pub(crate) fn parse(cases: &CasesToml) -> Result<CasePattern, CasePatternError> {
        match cases {
            CasesToml::All(s) if s == "all" => Ok(CasePattern::All),
            CasesToml::All(s) => Err(CasePatternError::NotAll(s.clone())),
            CasesToml::List(items) => {
                let mut set = BTreeSet::new();
                for item in items {
                    let (prompts, hit) = item
                        .split_once('/')
                        .ok_or_else(|| CasePatternError::NoHit(item.clone()))?;
                    let hit = match hit.trim() {
                        "*" => None,
                        h => Some(h.parse::<u32>().map_err(|_| CasePatternError::BadHit {
                            item: item.clone(),
                            hit: h.to_string(),
                        })?),
                    };
                    let prompts = parse_prompt_list(prompts).map_err(|source| {
                        CasePatternError::BadPrompts {
                            item: item.clone(),
                            source,
                        }
                    })?;
                    set.extend(prompts.into_iter().map(|n| (n, hit)));
                }
                Ok(CasePattern::Listed(set))
            }
        }
    }

    /// Whether the pattern covers the case of `prompt_len` tokens with a
    /// prefix hit of `prefix_hit`.
    pub fn covers(&self, prompt_len: u32, prefix_hit: u32) -> bool {
        match self {
            CasePattern::All => true,
            CasePattern::Listed(set) => {
                set.contains(&(prompt_len, Some(prefix_hit))) || set.contains(&(prompt_len, None))
            }
        }
    }
}

/// One expected failure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExpectedFailure {
    /// The geometry's name.
    pub geometry: String,
    /// `None`: both modes.
    pub mode: Option<String>,
    /// `None`: every allocation.
    pub alloc: Option<String>,
    /// The prompt lengths and prefix hits it covers.
    pub cases: CasePattern,
    /// The outcome's label in JSON reports (`violations`, `crashed`, ...).
    pub outcome: String,
    /// The exact set of oracles violated, when given.
    pub oracles: Option<BTreeSet<String>>,
    /// A substring of the outcome's description, when given.
    pub message: Option<String>,
    /// The page of docs/findings/ that explains it.
    pub finding: String,
}

/// Every expected failure of one file.
#[derive(Clone, Debug, Default)]
pub struct Expectations {
    /// In file order.
    pub failures: Vec<ExpectedFailure>,
}

/// Outcome labels an entry may name (as the JSON report writes them).
const OUTCOMES: [&str; 5] = [
    "violations",
    "crashed",
    "hung",
    "missing_rejection",
    "unexpected_rejection",
];

/// The JSON label of a report's outcome.
fn outcome_label(report: &CaseReport) -> String {
    serde_json::to_value(&report.outcome)
        .ok()
        .and_then(|v| v.get("kind").and_then(|k| k.as_str()).map(str::to_string))
        .unwrap_or_default()
}

impl Expectations {
    /// Read and check an expectations file.
    pub fn load(path: &Path) -> Result<Self, ExpectationsError> {
        let file = path.display().to_string();
        let read = |source| ExpectationsError::Read {
            file: file.clone(),
            source,
        };
        let text = read_text_capped(path, MAX_INPUT_BYTES).map_err(read)?;
        Self::parse(&file, &text)
    }

    /// Parse the text of an expectations file named `file`.
    pub fn parse(file: &str, text: &str) -> Result<Self, ExpectationsError> {
        let parsed: FileToml = toml::from_str(text).map_err(|source| ExpectationsError::Parse {
            file: file.to_string(),
            source,
        })?;
        let mut failures = Vec::new();
        for (index, e) in parsed.failure.into_iter().enumerate() {
            let bad = |why: String| ExpectationsError::Entry {
                file: file.to_string(),
                index: index + 1,
                geometry: e.geometry.clone(),
                why,
            };
            check_choice("mode", e.mode.as_deref(), &["pull", "push"])
                .map_err(|e| bad(e.to_string()))?;
            check_choice(
                "alloc",
                e.alloc.as_deref(),
                &["mainline", "with-last-token"],
            )
            .map_err(|e| bad(e.to_string()))?;
            if !OUTCOMES.contains(&e.outcome.as_str()) {
                return Err(bad(format!(
                    "outcome `{}`: expected one of {}",
                    e.outcome,
                    OUTCOMES.join(", ")
                )));
            }
            let cases = CasePattern::parse(&e.cases).map_err(|e| bad(e.to_string()))?;
            failures.push(ExpectedFailure {
                geometry: e.geometry,
                mode: e.mode,
                alloc: e.alloc,
                cases,
                outcome: e.outcome,
                oracles: e.oracles.map(|o| o.into_iter().collect()),
                message: e.message,
                finding: e.finding,
            });
        }
        Ok(Expectations { failures })
    }

    /// The expectations without their message texts (outcome kinds and
    /// oracle sets only).
    pub fn without_messages(&self) -> Self {
        let mut e = self.clone();
        for f in &mut e.failures {
            f.message = None;
        }
        e
    }

    /// The entries covering `case`.
    pub fn covering(&self, case: &Case) -> Vec<&ExpectedFailure> {
        self.failures.iter().filter(|e| e.covers(case)).collect()
    }

    /// Compare a sweep with the expectations: every listed case the sweep
    /// ran must fail as listed, and every other case must pass. Returns one
    /// line per disagreement.
    pub fn compare(&self, reports: &[CaseReport]) -> Vec<String> {
        let mut out = Vec::new();
        for r in reports {
            let covering: Vec<usize> = (0..self.failures.len())
                .filter(|&i| self.failures[i].covers(&r.case))
                .collect();
            let label = r.case.label();
            // A case vLLM's scheduler cannot make ran nowhere: neither an
            // unlisted failure nor a disagreement with its entry.
            if r.outcome.not_reachable() {
                continue;
            }
            match covering.as_slice() {
                [] if r.passed() => {}
                [] => out.push(format!(
                    "{label}: unexpected {}: {}",
                    outcome_label(r),
                    r.outcome.describe()
                )),
                [i] => {
                    if let Some(why) = self.failures[*i].disagreement(r) {
                        out.push(format!("{label}: {why}"));
                    }
                }
                many => out.push(format!(
                    "{label}: covered by {} entries ({})",
                    many.len(),
                    many.iter()
                        .map(|i| format!("#{}", i + 1))
                        .collect::<Vec<_>>()
                        .join(", ")
                )),
            }
        }
        out
    }

    /// The entries that cover no case of `reports`: stale, when `reports`
    /// is the full sweep the file describes; otherwise their cases were
    /// not run.
    pub fn unused(&self, reports: &[CaseReport]) -> Vec<String> {
        self.failures
            .iter()
            .enumerate()
            .filter(|(_, e)| !reports.iter().any(|r| e.covers(&r.case)))
            .map(|(i, e)| {
                format!(
                    "failure #{} ({} {})",
                    i + 1,
                    e.geometry,
                    e.mode.as_deref().unwrap_or("pull and push")
                )
            })
            .collect()
    }
}

impl ExpectedFailure {
    /// Whether this entry covers `case`.
    pub fn covers(&self, case: &Case) -> bool {
        if case.geometry_name() != self.geometry {
            return false;
        }
        if self
            .mode
            .as_deref()
            .is_some_and(|m| m != case.mode.as_str())
        {
            return false;
        }
        if self
            .alloc
            .as_deref()
            .is_some_and(|a| a != case.allocation.as_str())
        {
            return false;
        }
        self.cases.covers(case.prompt_len, case.prefix_hit)
    }

    /// Why `report` is not the failure this entry expects, if it is not.
    fn disagreement(&self, report: &CaseReport) -> Option<String> {
        if report.passed() {
            return Some(format!(
                "expected {} ({}), but it passed",
                self.outcome, self.finding
            ));
        }
        let label = outcome_label(report);
        if label != self.outcome {
            return Some(format!(
                "expected {}, got {label}: {}",
                self.outcome,
                report.outcome.describe()
            ));
        }
        if let Some(expected) = &self.oracles {
            let found: BTreeSet<String> = report
                .violations
                .iter()
                .map(|v| v.oracle.to_string())
                .collect();
            if &found != expected {
                return Some(format!(
                    "expected violations of {expected:?}, got {found:?}"
                ));
            }
        }
        if let Some(m) = &self.message {
            let text = report.outcome.describe();
            if !text.contains(m.as_str()) {
                return Some(format!(
                    "expected a message containing \"{m}\", got: {text}"
                ));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_parse_and_bad_ones_name_the_problem() {
        let text = r#"
[[failure]]
geometry = "g"
mode = "pull"
cases = ["1..=3/0", "9/*"]
outcome = "violations"
oracles = ["pairing"]
finding = "x.md"
"#;
        let e = Expectations::parse("t.toml", text).unwrap();
        let CasePattern::Listed(set) = &e.failures[0].cases else {
            panic!("listed");
        };
        assert!(set.contains(&(2, Some(0))) && set.contains(&(9, None)));
        for (bad, needle) in [
            (text.replace("\"pull\"", "\"both\""), "mode `both`"),
            (
                text.replace("\"violations\"", "\"broken\""),
                "outcome `broken`",
            ),
            (text.replace("\"9/*\"", "\"9\""), "expected PROMPTS/HIT"),
            (
                text.replace("[\"1..=3/0\", \"9/*\"]", "\"some\""),
                "cases `some`",
            ),
        ] {
            let err = Expectations::parse("t.toml", &bad).unwrap_err().to_string();
            assert!(err.contains(needle), "{err}");
        }
    }
}
