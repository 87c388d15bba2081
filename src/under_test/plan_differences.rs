//! Allowed plan differences: a TOML file per modelled release
//! (`expected/plan-differences/vllm-X.toml`, [`Release::plan_differences`])
//! listing the cases on which the release's own transfers may differ from
//! kvgeom's twin of it, each with the page of docs/findings/ that explains
//! why. A live sweep of a modelled release fails on any other plan
//! difference (docs/live-vllm.md, "Plan comparison and allowed
//! differences"); format in docs/report-format.md.
//!
//! Every modelled release has its file; one with nothing allowed holds only
//! comments.
//!
//! [`Release::plan_differences`]: super::Release::plan_differences

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::expectations::{check_choice, CasePattern, CasePatternError, CasesToml, ChoiceError};
use crate::limits::{read_text_capped, MAX_INPUT_BYTES};
use crate::scenario::Case;

/// Where findings live, relative to the project root.
pub const FINDINGS_DIR: &str = "docs/findings";

/// A plan-differences file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum PlanDifferencesError {
    /// The file cannot be read, is not a regular file, or is above the
    /// input limit.
    #[error("plan differences {file}: {}", source.reason())]
    Read {
        /// The file.
        file: String,
        /// Why it cannot be read.
        source: crate::limits::InputError,
    },
    /// The file is not valid TOML of the expected shape (an unknown key
    /// included).
    #[error("plan differences {file}: {}", source.to_string().trim_end())]
    Parse {
        /// The file.
        file: String,
        /// The parser's error.
        source: toml::de::Error,
    },
    /// One `[[difference]]` entry is inconsistent.
    #[error("plan differences {file}: difference #{index} ({geometry}): {why}")]
    Entry {
        /// The file.
        file: String,
        /// The entry's position, from 1.
        index: usize,
        /// The geometry the entry names.
        geometry: String,
        /// What is wrong with it.
        why: Box<EntryProblem>,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileToml {
    #[serde(default)]
    difference: Vec<EntryToml>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EntryToml {
    geometry: String,
    mode: Option<String>,
    alloc: Option<String>,
    requests: Option<String>,
    cases: CasesToml,
    finding: String,
    reason: String,
}

/// One allowed difference.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllowedDifference {
    /// The geometry's name (its file name without `.toml`).
    pub geometry: String,
    /// `pull` or `push`; `None`: both.
    pub mode: Option<String>,
    /// `mainline` or `with-last-token`; `None`: both.
    pub alloc: Option<String>,
    /// `direct` or `scheduler`: who made the request; `None`: either.
    pub requests: Option<String>,
    /// The prompt lengths and prefix hits it covers.
    pub cases: CasePattern,
    /// The finding that explains it, as the project root names it
    /// (`docs/findings/NAME.md`, an anchor kept).
    pub finding: String,
    /// Why the difference is allowed, in a sentence.
    pub reason: String,
}

/// Every allowed difference of one file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PlanDifferences {
    /// The file they came from, as given.
    pub file: String,
    /// In file order.
    pub differences: Vec<AllowedDifference>,
}

impl PlanDifferences {
    /// Read and check the file at `path`; findings are looked up under
    /// `root`/docs/findings/.
    pub fn load(path: &Path, root: &Path) -> Result<Self, PlanDifferencesError> {
        let file = path.display().to_string();
        let read = |source| PlanDifferencesError::Read {
            file: file.clone(),
            source,
        };
        let text = read_text_capped(path, MAX_INPUT_BYTES).map_err(read)?;
        Self::parse(&file, &text, root)
    }

    /// Parse the text of a file named `file`, its findings under
    /// `root`/docs/findings/.
    pub fn parse(file: &str, text: &str, root: &Path) -> Result<Self, PlanDifferencesError> {
        let parsed: FileToml =
            toml::from_str(text).map_err(|source| PlanDifferencesError::Parse {
                file: file.to_string(),
                source,
            })?;
        let mut differences = Vec::new();
        for (index, e) in parsed.difference.into_iter().enumerate() {
            let bad = |why: EntryProblem| PlanDifferencesError::Entry {
                file: file.to_string(),
                index: index + 1,
                geometry: e.geometry.clone(),
                why: Box::new(why),
            };
            if e.geometry.is_empty()
                || e.geometry.contains(['/', '\\'])
                || e.geometry.ends_with(".toml")
            {
                return Err(bad(EntryProblem::NotAName(e.geometry.clone())));
            }
            check_choice("mode", e.mode.as_deref(), &["pull", "push"])
                .map_err(|e| bad(e.into()))?;
            check_choice(
                "alloc",
                e.alloc.as_deref(),
                &["mainline", "with-last-token"],
            )
            .map_err(|e| bad(e.into()))?;
            check_choice("requests", e.requests.as_deref(), &["direct", "scheduler"])
                .map_err(|e| bad(e.into()))?;
            let cases = CasePattern::parse(&e.cases).map_err(|e| bad(e.into()))?;
            let finding = finding_path(&e.finding, root).map_err(bad)?;
            if e.reason.trim().is_empty() {
                return Err(bad(EntryProblem::EmptyReason));
            }
            differences.push(AllowedDifference {
                geometry: e.geometry,
                mode: e.mode,
                alloc: e.alloc,
                requests: e.requests,
                cases,
                finding,
                reason: e.reason,
            });
        }
        Ok(PlanDifferences {
            file: file.to_string(),
            differences,
        })
    }

    /// The first entry that allows a plan difference on `case`, whose
    /// request was made by `requests` (`direct` or `scheduler`).
    pub fn allowing(&self, case: &Case, requests: &str) -> Option<&AllowedDifference> {
        self.differences.iter().find(|d| d.covers(case, requests))
    }
}

impl AllowedDifference {
    /// Whether this entry covers `case`, whose request was made by
    /// `requests`.
    pub fn covers(&self, case: &Case, requests: &str) -> bool {
        let matches =
            |wanted: &Option<String>, actual: &str| wanted.as_deref().is_none_or(|w| w == actual);
        case.geometry_name() == self.geometry
            && matches(&self.mode, case.mode.as_str())
            && matches(&self.alloc, case.allocation.as_str())
            && matches(&self.requests, requests)
            && self.cases.covers(case.prompt_len, case.prefix_hit)
    }

    /// The entry as its messages name it: `GEOMETRY MODE ALLOC REQUESTS`,
    /// the unset ones left out.
    pub fn describe(&self) -> String {
        [
            Some(self.geometry.as_str()),
            self.mode.as_deref(),
            self.alloc.as_deref(),
            self.requests.as_deref(),
        ]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join(" ")
    }
}

/// What is wrong with one `[[difference]]` entry.
#[derive(Debug, thiserror::Error)]
pub enum EntryProblem {
    /// `geometry` is a path or a file name, not a geometry's name.
    #[error("geometry `{0}`: expected a geometry's name (its file name without `.toml`)")]
    NotAName(String),
    /// A key with a value outside its choices.
    #[error(transparent)]
    Choice(#[from] ChoiceError),
    /// `cases` does not parse.
    #[error(transparent)]
    Cases(#[from] CasePatternError),
    /// `finding` does not name a page of docs/findings/.
    #[error("finding `{0}`: expected a page of {FINDINGS_DIR}/ by its file name, e.g. `vllm-0.34.0-last-token-pairing.md`")]
    NotAFindingPage(String),
    /// `finding` names a page that does not exist.
    #[error("finding `{name}`: no such page ({} does not exist)", path.display())]
    NoSuchFinding {
        /// The finding as written.
        name: String,
        /// The page looked for.
        path: PathBuf,
    },
    /// `reason` is empty.
    #[error("reason: empty; say why the difference is allowed")]
    EmptyReason,
}

/// The finding `name` (a page of docs/findings/, by its file name or as
/// `docs/findings/NAME`, an `#anchor` allowed) as `docs/findings/NAME`,
/// when the page exists under `root`.
fn finding_path(name: &str, root: &Path) -> Result<String, EntryProblem> {
    let bare = name
        .strip_prefix(FINDINGS_DIR)
        .and_then(|n| n.strip_prefix('/'))
        .unwrap_or(name);
    let page = bare.split('#').next().unwrap_or_default();
    if page.is_empty() || page.contains(['/', '\\']) || !page.ends_with(".md") {
        return Err(EntryProblem::NotAFindingPage(name.to_string()));
    }
    let file: PathBuf = root.join(FINDINGS_DIR).join(page);
    if !file.is_file() {
        return Err(EntryProblem::NoSuchFinding {
            name: name.to_string(),
            path: file,
        });
    }
    Ok(format!("{FINDINGS_DIR}/{bare}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::geometry::Mode;
    use crate::scheduler::DecodeAllocation;
    use crate::under_test::RELEASES;
    use crate::variant::Variant;

    fn root() -> &'static Path {
        Path::new(env!("CARGO_MANIFEST_DIR"))
    }

    const ENTRY: &str = r#"
# One allowed difference.
[[difference]]
geometry = "gqa-prefill-logical-larger"
mode = "pull"
alloc = "mainline"
requests = "direct"
cases = ["1..=3/0", "9/*"]
finding = "vllm-0.34.0-last-token-pairing.md"
reason = "an example"
"#;

    fn case(geometry: &str, prompt_len: u32, prefix_hit: u32) -> Case {
        let path = root().join("geometries").join(format!("{geometry}.toml"));
        let geometry = crate::derive::load_geometry_file(&path).expect("geometry loads");
        Case {
            geometry: std::sync::Arc::new(geometry),
            file: Some(path),
            prompt_len,
            prefix_hit,
            mode: Mode::Pull,
            allocation: DecodeAllocation::Mainline,
            seed: 0,
            variant: Variant::Policy(RELEASES[0].policy),
        }
    }

    #[test]
    fn an_entry_covers_exactly_its_cases() {
        let file = PlanDifferences::parse("t.toml", ENTRY, root()).expect("parses");
        let d = &file.differences[0];
        assert_eq!(d.finding, "docs/findings/vllm-0.34.0-last-token-pairing.md");
        assert_eq!(
            d.describe(),
            "gqa-prefill-logical-larger pull mainline direct"
        );
        let g = "gqa-prefill-logical-larger";
        assert!(file.allowing(&case(g, 2, 0), "direct").is_some());
        assert!(file.allowing(&case(g, 9, 16), "direct").is_some());
        assert!(file.allowing(&case(g, 4, 0), "direct").is_none());
        assert!(file.allowing(&case(g, 2, 0), "scheduler").is_none());
        let mut push = case(g, 2, 0);
        push.mode = Mode::Push;
        assert!(file.allowing(&push, "direct").is_none());
        assert!(file
            .allowing(&case("gqa-kernel-ratio4", 2, 0), "direct")
            .is_none());
    }

    #[test]
    fn a_file_of_comments_allows_nothing() {
        let file = PlanDifferences::parse("t.toml", "# nothing allowed\n", root()).expect("parses");
        assert!(file.differences.is_empty());
    }

    #[test]
    fn bad_entries_are_errors_that_name_the_problem() {
        for (bad, needle) in [
            (
                ENTRY.replace("\"pull\"", "\"both\""),
                "mode `both`: expected pull or push",
            ),
            (ENTRY.replace("\"mainline\"", "\"all\""), "alloc `all`"),
            (
                ENTRY.replace("\"direct\"", "\"driver\""),
                "requests `driver`",
            ),
            (ENTRY.replace("\"9/*\"", "\"9\""), "expected PROMPTS/HIT"),
            (
                ENTRY.replace("\"1..=3/0\", \"9/*\"", "\"1..=x/0\""),
                "case `1..=x/0`",
            ),
            (
                ENTRY.replace("[\"1..=3/0\", \"9/*\"]", "\"some\""),
                "cases `some`",
            ),
            (
                ENTRY.replace("vllm-0.34.0-last-token-pairing.md", "no-such-finding.md"),
                "finding `no-such-finding.md`: no such page",
            ),
            (
                ENTRY.replace("vllm-0.34.0-last-token-pairing.md", "../README.md"),
                "expected a page of docs/findings/",
            ),
            (
                ENTRY.replace(
                    "\"gqa-prefill-logical-larger\"",
                    "\"geometries/gqa-prefill-logical-larger.toml\"",
                ),
                "expected a geometry's name",
            ),
            (ENTRY.replace("\"an example\"", "\" \""), "reason: empty"),
            (ENTRY.replace("reason = ", "why = "), "unknown field `why`"),
            (
                ENTRY.replace("reason = \"an example\"", ""),
                "missing field `reason`",
            ),
            (
                ENTRY.replace("[[difference]]", "[[allowed]]"),
                "unknown field `allowed`",
            ),
        ] {
            let err = PlanDifferences::parse("t.toml", &bad, root())
                .expect_err(needle)
                .to_string();
            assert!(err.contains(needle), "{needle}: {err}");
            assert!(err.starts_with("plan differences t.toml"), "{err}");
        }
        let entry_error =
            PlanDifferences::parse("t.toml", &ENTRY.replace("\"pull\"", "\"x\""), root())
                .expect_err("bad mode")
                .to_string();
        assert!(
            entry_error.contains("difference #1 (gqa-prefill-logical-larger)"),
            "{entry_error}"
        );
    }

    #[test]
    fn a_finding_may_be_named_with_its_folder_and_an_anchor() {
        let text = ENTRY.replace(
            "\"vllm-0.34.0-last-token-pairing.md\"",
            "\"docs/findings/vllm-0.33.0-push-hetero-geometry.md#3\"",
        );
        let file = PlanDifferences::parse("t.toml", &text, root()).expect("parses");
        assert_eq!(
            file.differences[0].finding,
            "docs/findings/vllm-0.33.0-push-hetero-geometry.md#3"
        );
    }

    #[test]
    fn a_missing_file_is_an_error_naming_it() {
        let err = PlanDifferences::load(Path::new("/nonexistent/x.toml"), root())
            .expect_err("missing")
            .to_string();
        assert!(err.contains("/nonexistent/x.toml"), "{err}");
    }

    #[test]
    fn every_modelled_release_has_a_valid_committed_file() {
        for release in &RELEASES {
            let path = root().join(release.plan_differences());
            if let Err(e) = PlanDifferences::load(&path, root()) {
                panic!("{}: {e}", release.version);
            }
        }
    }
}
