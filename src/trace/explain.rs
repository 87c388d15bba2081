//! Which known defects explain a trace that kvgeom's connector does not
//! reproduce: the smallest set of defects of [`crate::defects`] whose
//! policy rebuilds the trace exactly (every list, every transfer and the
//! rewritten remote ids).
//!
//! The search stays cheap: every single defect first (one rebuild each), then
//! vLLM 0.33.0's defects together, shrunk by leaving out, one at a time, each
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
    /// vLLM 0.33.0's defects reproduce it together, none alone; these are
    /// the ones it needs, in table order.
    Vllm0330Defects(Vec<Defect>),
    /// No single defect and not vLLM 0.33.0's defects together.
    Unexplained,
}

impl Explanation {
    /// The defects that explain the trace, in table order (empty when none
    /// does).
    pub fn defects(&self) -> Vec<Defect> {
        match self {
            Explanation::Defect(d) => vec![*d],
            Explanation::Vllm0330Defects(set) => set.clone(),
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
            Explanation::Vllm0330Defects(set) => {
                f.write_str("explained by vLLM 0.33.0's defects together: ")?;
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
/// defect, vLLM 0.33.0's own first (each in table order: where several
/// reproduce a trace, the one the traced vLLM has is named), else a subset
/// of vLLM 0.33.0's defects from which no member can be left out.
/// `reproduces` is asked at most
/// `Defect::ALL.len() + 1 + |vLLM 0.33.0's defects|` times.
pub fn smallest_explaining_set(mut reproduces: impl FnMut(&Policy) -> bool) -> Explanation {
    let mut set = Defect::of_vllm_0_33_0();
    let others = Defect::ALL.into_iter().filter(|d| !set.contains(d));
    let singles: Vec<Defect> = set.iter().copied().chain(others).collect();
    if let Some(d) = singles.into_iter().find(|d| reproduces(&d.policy())) {
        return Explanation::Defect(d);
    }
    if !reproduces(&policy_with(&set)) {
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
    Explanation::Vllm0330Defects(set)
}

/// What explains `case`'s difference from kvgeom's connector. A candidate
/// policy explains it only if its rebuild matches the trace exactly; one
/// whose connector refuses the case explains nothing. Meant for a trace that
/// kvgeom's policy does not reproduce: on one it does, the first defect that
/// changes nothing there (a push defect on a pull trace) would be named.
pub fn explain_difference(case: &TraceCase) -> Explanation {
    smallest_explaining_set(|policy| {
        diff_against_connector(case, *policy).is_ok_and(|report| report.is_match())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connector::policy::{ConvSplit, PrefixAlignment};

    #[test]
    fn a_single_defect_comes_first_in_table_order() {
        let found = smallest_explaining_set(|p| p.prefix_alignment == PrefixAlignment::EndTrim);
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
        let found = smallest_explaining_set(|p| {
            asked += 1;
            p.prefix_alignment == PrefixAlignment::EndTrim
                && p.conv_split == ConvSplit::LocalWidthsScaled
        });
        assert_eq!(
            found,
            Explanation::Vllm0330Defects(vec![Defect::EndTrimAlignment, Defect::ConvOffsetsScaled])
        );
        assert_eq!(
            found.names().as_deref(),
            Some("end-trim-alignment+conv-offsets-scaled")
        );
        assert!(found.to_string().starts_with(
            "explained by vLLM 0.33.0's defects together: `end-trim-alignment` (vLLM 0.33.0 end-trim alignment) + `conv-offsets-scaled`"
        ));
        assert!(asked <= Defect::ALL.len() + 1 + Defect::of_vllm_0_33_0().len());
    }

    #[test]
    fn nothing_reproduces_means_unexplained() {
        let found = smallest_explaining_set(|_| false);
        assert_eq!(found, Explanation::Unexplained);
        assert_eq!(found.names(), None);
        assert_eq!(found.to_string(), "no known defect explains it");
        // kvgeom's own policy is never an explanation.
        assert_eq!(
            smallest_explaining_set(|p| *p == Policy::default()),
            Explanation::Unexplained
        );
    }
}
