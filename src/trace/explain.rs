//! Which known defects explain a trace that kvgeom's connector does not
//! reproduce: the smallest set of defects of [`crate::defects`] whose
//! policy rebuilds the trace exactly (every list, every transfer and the
//! rewritten remote ids).
//!
//! The search stays cheap: every single defect first (one rebuild each), then
//! the defects of the vLLM release the trace records (vLLM 0.33.0's) together, shrunk by leaving out, one at a time, each
//! defect the trace does not need. The result is a set none of whose members
//! can be left out; it is not searched among every subset of the table.

use std::fmt;

use super::case::TraceCase;
use super::replay::diff_against_connector;
use crate::connector::Policy;
use crate::defects::{policy_with, Defect};

/// What explains a trace that kvgeom's connector does not reproduce.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Explanation {
    /// One defect alone reproduces the trace (the first in table order
    /// where several would).
    Defect(Defect),
    /// The traced vLLM release's defects (vLLM 0.33.0's) reproduce it
    /// together, none alone; these are the ones it needs, in table order.
    ReleaseDefects {
        /// The vLLM release the trace records.
        version: String,
        /// The defects it needs.
        defects: Vec<Defect>,
    },
    /// No single defect and not the release's defects together.
    Unexplained,
}

impl Explanation {
    /// The defects that explain the trace, in table order (empty when none
    /// does).
    pub fn defects(&self) -> Vec<Defect> {
        match self {
            Explanation::Defect(d) => vec![*d],
            Explanation::ReleaseDefects { defects, .. } => defects.clone(),
            Explanation::Unexplained => Vec::new(),
        }
    }

    /// The defects' command-line names joined by `+`
    /// (`"end-trim-alignment"`), or `None` when no defect explains it.
    pub fn names(&self) -> Option<String> {
        let names: Vec<&str> = self.defects().iter().map(|d| d.name()).collect();
        (!names.is_empty()).then(|| names.join("+"))
    }
}

impl fmt::Display for Explanation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Explanation::Defect(d) => {
                write!(f, "explained by defect `{}` ({})", d.name(), d.title())
            }
            Explanation::ReleaseDefects {
                version,
                defects: set,
            } => {
                write!(f, "explained by vLLM {version}'s defects together: ")?;
                for (i, d) in set.iter().enumerate() {
                    if i > 0 {
                        f.write_str(" + ")?;
                    }
                    write!(f, "`{}` ({})", d.name(), d.title())?;
                }
                Ok(())
            }
            Explanation::Unexplained => f.write_str("no known defect explains it"),
        }
    }
}

/// The smallest set of defects whose policy `reproduces` accepts: a single
/// defect, those of vLLM `version` (the release the trace records, e.g.
/// 0.33.0) first (each in table order: where several reproduce a trace, the
/// one the traced vLLM has is named), else a subset of that release's
/// defects from which no member can be left out. A release with no known
/// defects (one kvgeom does not model) is explained by single defects only.
/// `reproduces` is asked at most
/// `Defect::ALL.len() + 1 + |the release's defects|` times.
pub fn smallest_explaining_set(
    version: &str,
    mut reproduces: impl FnMut(&Policy) -> bool,
) -> Explanation {
    let mut set = Defect::of_vllm(version);
    let others = Defect::ALL.into_iter().filter(|d| !set.contains(d));
    let singles: Vec<Defect> = set.iter().copied().chain(others).collect();
    if let Some(d) = singles.into_iter().find(|d| reproduces(&d.policy())) {
        return Explanation::Defect(d);
    }
    if set.is_empty() || !reproduces(&policy_with(&set)) {
        return Explanation::Unexplained;
    }
    let mut i = 0;
    while i < set.len() {
        let mut without = set.clone();
        without.remove(i);
        if reproduces(&policy_with(&without)) {
            set = without;
        } else {
            i += 1;
        }
    }
    Explanation::ReleaseDefects {
        version: version.to_string(),
        defects: set,
    }
}

/// What explains `case`'s difference from kvgeom's connector. A candidate
/// policy explains it only if its rebuild matches the trace exactly; one
/// whose connector refuses the case explains nothing. Meant for a trace that
/// kvgeom's policy does not reproduce: on one it does, the first defect that
/// changes nothing there (a push defect on a pull trace) would be named.
pub fn explain_difference(case: &TraceCase) -> Explanation {
    smallest_explaining_set(&case.meta.vllm, |policy| {
        diff_against_connector(case, *policy).is_ok_and(|report| report.is_match())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connector::policy::{ConvSplit, PrefixAlignment};

    /// The release vLLM's traces record (the project's pinned vLLM).
    const PINNED: &str = "0.33.0";

    #[test]
    fn a_single_defect_comes_first_in_table_order() {
        let found =
            smallest_explaining_set(PINNED, |p| p.prefix_alignment == PrefixAlignment::EndTrim);
        assert_eq!(found, Explanation::Defect(Defect::EndTrimAlignment));
        assert_eq!(found.names().as_deref(), Some("end-trim-alignment"));
        assert_eq!(
            found.to_string(),
            "explained by defect `end-trim-alignment` (vLLM 0.33.0 end-trim alignment)"
        );
    }

    #[test]
    fn a_set_is_shrunk_to_the_defects_it_needs() {
        let mut asked = 0;
        let found = smallest_explaining_set(PINNED, |p| {
            asked += 1;
            p.prefix_alignment == PrefixAlignment::EndTrim
                && p.conv_split == ConvSplit::LocalWidthsScaled
        });
        assert_eq!(
            found,
            Explanation::ReleaseDefects {
                version: PINNED.into(),
                defects: vec![Defect::EndTrimAlignment, Defect::ConvOffsetsScaled]
            }
        );
        assert_eq!(
            found.names().as_deref(),
            Some("end-trim-alignment+conv-offsets-scaled")
        );
        assert!(found.to_string().starts_with(
            "explained by vLLM 0.33.0's defects together: `end-trim-alignment` (vLLM 0.33.0 end-trim alignment) + `conv-offsets-scaled`"
        ));
        assert!(asked <= Defect::ALL.len() + 1 + Defect::of_vllm(PINNED).len());
    }

    #[test]
    fn nothing_reproduces_means_unexplained() {
        let found = smallest_explaining_set(PINNED, |_| false);
        assert_eq!(found, Explanation::Unexplained);
        assert_eq!(found.names(), None);
        assert_eq!(found.to_string(), "no known defect explains it");
        // kvgeom's own policy is never an explanation.
        assert_eq!(
            smallest_explaining_set(PINNED, |p| *p == Policy::default()),
            Explanation::Unexplained
        );
    }

    #[test]
    fn a_release_without_known_defects_is_explained_by_single_defects_only() {
        let both = |p: &Policy| {
            p.prefix_alignment == PrefixAlignment::EndTrim
                && p.conv_split == ConvSplit::LocalWidthsScaled
        };
        assert_eq!(
            smallest_explaining_set("0.29.0", both),
            Explanation::Unexplained
        );
        let found =
            smallest_explaining_set("0.29.0", |p| p.prefix_alignment == PrefixAlignment::EndTrim);
        assert_eq!(found, Explanation::Defect(Defect::EndTrimAlignment));
    }
}
