//! Which connector a harness run uses: a named policy (kvgeom's, or vLLM
//! 0.33.0's as released), or kvgeom's policy with one known defect.

use serde::{Serialize, Serializer};

use crate::connector::{NamedPolicy, Policy};
use crate::defects::Defect;

/// The connector variant of a case or a sweep.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Variant {
    /// A named policy (`--policy NAME`).
    Policy(NamedPolicy),
    /// kvgeom's policy with one defect's decision (`--defect NAME`).
    Defect(Defect),
}

impl Default for Variant {
    fn default() -> Self {
        Variant::KVGEOM
    }
}

impl Variant {
    /// kvgeom's own connector.
    pub const KVGEOM: Variant = Variant::Policy(NamedPolicy::Kvgeom);

    /// The decisions the connector runs with.
    pub fn policy(self) -> Policy {
        match self {
            Variant::Policy(p) => p.policy(),
            Variant::Defect(d) => d.policy(),
        }
    }

    /// The defect, for a single-defect variant.
    pub fn defect(self) -> Option<Defect> {
        match self {
            Variant::Policy(_) => None,
            Variant::Defect(d) => Some(d),
        }
    }

    /// The named policy the variant starts from (kvgeom's for a defect).
    pub fn named_policy(self) -> NamedPolicy {
        match self {
            Variant::Policy(p) => p,
            Variant::Defect(_) => NamedPolicy::Kvgeom,
        }
    }

    /// The options that select this variant on the command line (empty for kvgeom's).
    pub fn cli_args(self) -> String {
        match self {
            Variant::Policy(NamedPolicy::Kvgeom) => String::new(),
            Variant::Policy(p) => format!(" --policy {p}"),
            Variant::Defect(d) => format!(" --defect {d}"),
        }
    }
}

impl std::fmt::Display for Variant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Variant::Policy(p) => write!(f, "{p}"),
            Variant::Defect(d) => write!(f, "defect {d}"),
        }
    }
}

impl Serialize for Variant {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}
