//! What ran, as a value: [`CodeUnderTest`] names the connector, its version,
//! the policy it is judged as and the source tree it came from; the release
//! table ([`RELEASES`]) maps a release kvgeom models to its reference policy,
//! its expectations file and the driver's API profile. A release missing
//! from the table is still run, but its plan comparison is information and
//! no expectations apply.

use serde::{Deserialize, Serialize};

use crate::connector::NamedPolicy;
use crate::defects::Defect;
use crate::variant::Variant;

/// Which connector ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ConnectorKind {
    /// kvgeom's own Rust connector.
    Kvgeom,
    /// vLLM's Python NIXL connector, through `vllm-driver/`.
    Vllm,
    /// SGLang's connector.
    Sglang,
}

impl ConnectorKind {
    /// The name used in reports (`"kvgeom"`, `"vllm"`, `"sglang"`).
    pub fn name(self) -> &'static str {
        match self {
            ConnectorKind::Kvgeom => "kvgeom",
            ConnectorKind::Vllm => "vllm",
            ConnectorKind::Sglang => "sglang",
        }
    }
}

/// A source tree the code under test was installed from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceTree {
    /// The checkout's folder.
    pub path: String,
    /// Its `HEAD` commit.
    pub commit: String,
    /// Whether it has local changes.
    pub dirty: bool,
}

/// The code a run judged: `code_under_test` in the reports
/// (docs/report-format.md).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CodeUnderTest {
    /// The connector.
    pub connector: ConnectorKind,
    /// Its version: kvgeom's crate version, or the installed vLLM's.
    pub version: String,
    /// The policy it is judged as: kvgeom's variant (`kvgeom`,
    /// `vllm-0.33.0`, `defect NAME`), or for another connector the reference
    /// policy of its release; `None` when kvgeom models no such release.
    pub policy: Option<String>,
    /// The source tree it came from; `None` for kvgeom's own connector (the
    /// binary's version names it) and for an installed release.
    pub source: Option<SourceTree>,
    /// The installed package's files that differ from the hashes its
    /// dist-info RECORD lists (absent in JSON when none does): a release
    /// edited in place or a branch copied over it is not that release.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub modified_files: Vec<String>,
    /// The torch it ran on, for a connector run by a Python driver that
    /// names it (SGLang's; absent in JSON otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub torch: Option<String>,
    /// The dependency pins of the release that the package index lacked and
    /// that its install replaced, as the venv's `.kvgeom-substitutions`
    /// lists them (`WANTED -> CHOSEN (why)`; absent in JSON when none was).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub substitutions: Vec<String>,
}

impl CodeUnderTest {
    /// kvgeom's own connector running `variant`.
    pub fn kvgeom(variant: Variant) -> CodeUnderTest {
        CodeUnderTest {
            connector: ConnectorKind::Kvgeom,
            version: env!("CARGO_PKG_VERSION").to_string(),
            policy: Some(variant.to_string()),
            source: None,
            modified_files: Vec::new(),
            torch: None,
            substitutions: Vec::new(),
        }
    }

    /// SGLang's connector at `version`, on `torch`, as the SGLang driver
    /// reports them. kvgeom models no SGLang release as a policy.
    pub fn sglang(version: &str, torch: &str) -> CodeUnderTest {
        CodeUnderTest {
            connector: ConnectorKind::Sglang,
            version: version.to_string(),
            policy: None,
            source: None,
            modified_files: Vec::new(),
            torch: Some(torch.to_string()),
            substitutions: Vec::new(),
        }
    }

    /// vLLM's connector at the installed `version`.
    pub fn vllm(version: &str) -> CodeUnderTest {
        CodeUnderTest {
            connector: ConnectorKind::Vllm,
            version: version.to_string(),
            policy: Release::of(ConnectorKind::Vllm, version).map(|r| r.policy.name().to_string()),
            source: None,
            modified_files: Vec::new(),
            torch: None,
            substitutions: Vec::new(),
        }
    }

    /// The code as a person reads it: `vLLM 0.33.0`, then `, modified: N
    /// files` or ` from PATH at COMMIT` (`, with local changes`) when it is
    /// not the release as published.
    pub fn describe(&self) -> String {
        let name = match self.connector {
            ConnectorKind::Kvgeom => "kvgeom",
            ConnectorKind::Vllm => "vLLM",
            ConnectorKind::Sglang => "SGLang",
        };
        let mut text = format!("{name} {}", self.version);
        if let Some(torch) = &self.torch {
            text.push_str(&format!(" (torch {torch})"));
        }
        if let Some(tree) = &self.source {
            let commit = tree.commit.get(..12).unwrap_or(&tree.commit);
            text.push_str(&format!(" from {} at {commit}", tree.path));
            if tree.dirty {
                text.push_str(", with local changes");
            }
        }
        if !self.modified_files.is_empty() {
            let n = self.modified_files.len();
            text.push_str(&format!(
                ", modified: {n} file{}",
                if n == 1 { "" } else { "s" }
            ));
        }
        text
    }

    /// Its row of the release table, when kvgeom models it (never for
    /// kvgeom's own connector, which is judged by its variant).
    pub fn release(&self) -> Option<&'static Release> {
        if self.source.is_some() || !self.modified_files.is_empty() {
            return None;
        }
        Release::of(self.connector, &self.version)
    }

    /// The kvgeom policy its plans are compared with, when its release is
    /// in the table.
    pub fn reference_policy(&self) -> Option<NamedPolicy> {
        self.release().map(|r| r.policy)
    }

    /// The expectations file of its release (relative to the project root).
    pub fn expectations(&self) -> Option<&'static str> {
        self.release().map(|r| r.expectations)
    }
}

/// What the driver checks of a release's Python API before it runs a case
/// (`vllm-driver/api_check.py`): the profile the release is driven with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ApiProfile {
    /// The profile's name.
    pub name: &'static str,
    /// The driver's module that checks it.
    pub checker: &'static str,
}

/// One release kvgeom models.
#[derive(Clone, Copy, Debug)]
pub struct Release {
    /// The connector it is a release of.
    pub connector: ConnectorKind,
    /// Its version, as the installed package reports it.
    pub version: &'static str,
    /// The kvgeom policy that models it (its known defects included).
    pub policy: NamedPolicy,
    /// Where it fails on `geometries/`, case by case (relative to the project root).
    pub expectations: &'static str,
    /// What the driver checks of its API.
    pub api: ApiProfile,
}

/// Every release kvgeom models; the first is the one the project's venv
/// pins (`scripts/install-vllm.sh`: vLLM 0.34.0), then the older ones, each
/// with its own policy and expectations. vLLM 0.30.0-0.32.0 install and run,
/// but have no row: nothing models their connector; their plans are
/// compared with [`Release::nearest_vllm`]'s policy as information.
pub static RELEASES: [Release; 2] = [
    Release {
        connector: ConnectorKind::Vllm,
        version: "0.34.0",
        policy: NamedPolicy::Vllm0340,
        expectations: "expected/vllm-0.34.0.toml",
        api: ApiProfile {
            name: "vllm-0.34.0",
            checker: "vllm-driver/api_check.py",
        },
    },
    Release {
        connector: ConnectorKind::Vllm,
        version: "0.33.0",
        policy: NamedPolicy::Vllm0330,
        expectations: "expected/vllm-0.33.0.toml",
        api: ApiProfile {
            name: "vllm-0.33.0",
            checker: "vllm-driver/api_check.py",
        },
    },
];

impl Release {
    /// The release the project's venv pins.
    pub fn pinned() -> &'static Release {
        &RELEASES[0]
    }

    /// The row of `connector` at `version`, if kvgeom models it.
    pub fn of(connector: ConnectorKind, version: &str) -> Option<&'static Release> {
        RELEASES
            .iter()
            .find(|r| r.connector == connector && r.version == version)
    }

    /// The vLLM release at `version`, if kvgeom models it.
    pub fn of_vllm(version: &str) -> Option<&'static Release> {
        Release::of(ConnectorKind::Vllm, version)
    }

    /// Its file of allowed plan differences (relative to the project root):
    /// `expected/plan-differences/vllm-X.toml`, the cases on which its own
    /// transfers may differ from its policy's, each citing a finding
    /// (`under_test::plan_differences`). Every modelled release has one.
    pub fn plan_differences(&self) -> String {
        format!(
            "expected/plan-differences/{}-{}.toml",
            self.connector.name(),
            self.version
        )
    }

    /// The known defects it has, in table order (`crate::defects`).
    pub fn defects(&self) -> Vec<Defect> {
        Defect::of_vllm(self.version)
    }

    /// The kvgeom policy its plans are compared with.
    pub fn reference_policy(&self) -> NamedPolicy {
        self.policy
    }

    /// The modelled vLLM release whose policy a vLLM at `version` is
    /// compared with, as information, when the table has no row for it:
    /// the newest modelled release older than `version` (a `.devN` or `rcN`
    /// build comes before its release, so a branch of vLLM main, which
    /// reports the next release's dev build, is compared with the release
    /// before it), else the oldest modelled one; a version that is not a
    /// number is compared with the pinned release.
    pub fn nearest_vllm(version: &str) -> &'static Release {
        let Some(wanted) = release_key(version) else {
            return Release::pinned();
        };
        let mut modelled: Vec<(&'static Release, ReleaseKey)> = RELEASES
            .iter()
            .filter(|r| r.connector == ConnectorKind::Vllm)
            .filter_map(|r| release_key(r.version).map(|k| (r, k)))
            .collect();
        modelled.sort_by(|a, b| a.1.cmp(&b.1));
        modelled
            .iter()
            .rev()
            .find(|(_, key)| *key <= wanted)
            .or_else(|| modelled.first())
            .map_or_else(Release::pinned, |(r, _)| *r)
    }
}

/// A version's order: its numbers, then 0 for a pre-release (`.devN`,
/// `rcN`, `aN`, `bN`) and 1 for the release itself, then the pre-release's
/// number.
type ReleaseKey = (Vec<u64>, u8, u64);

/// `version` as a [`ReleaseKey`]; `None` when it does not start with a
/// number. A local part (`+g1234abc`) is ignored.
fn release_key(version: &str) -> Option<ReleaseKey> {
    let public = version.split('+').next().unwrap_or_default();
    let mut numbers = Vec::new();
    let mut rest = public;
    loop {
        let digits = rest.chars().take_while(char::is_ascii_digit).count();
        if digits == 0 {
            break;
        }
        numbers.push(rest[..digits].parse().ok()?);
        rest = &rest[digits..];
        match rest.strip_prefix('.') {
            Some(r) if r.starts_with(|c: char| c.is_ascii_digit()) => rest = r,
            _ => break,
        }
    }
    if numbers.is_empty() {
        return None;
    }
    let tag = rest.trim_start_matches(['.', '-']);
    if tag.is_empty() || tag.starts_with("post") {
        return Some((numbers, 1, 0));
    }
    let n = tag
        .trim_start_matches(|c: char| c.is_ascii_alphabetic())
        .parse()
        .unwrap_or(0);
    Some((numbers, 0, n))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::defects::policy_with;

    #[test]
    fn the_pinned_release_maps_to_its_policy_expectations_and_profile() {
        let code = CodeUnderTest::vllm("0.34.0");
        let release = code.release().expect("0.34.0 is in the table");
        assert!(std::ptr::eq(release, Release::pinned()));
        assert_eq!(
            code.reference_policy().map(NamedPolicy::name),
            Some("vllm-0.34.0")
        );
        assert_eq!(code.expectations(), Some("expected/vllm-0.34.0.toml"));
        assert_eq!(code.policy.as_deref(), Some("vllm-0.34.0"));
        assert_eq!(release.api.name, "vllm-0.34.0");
        // The release before it keeps its own row.
        let older = CodeUnderTest::vllm("0.33.0");
        assert_eq!(
            older.reference_policy().map(NamedPolicy::name),
            Some("vllm-0.33.0")
        );
        assert_eq!(older.expectations(), Some("expected/vllm-0.33.0.toml"));
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        assert!(root.join(release.expectations).is_file());
        assert!(root.join(release.api.checker).is_file());
    }

    #[test]
    fn a_release_not_in_the_table_maps_to_nothing() {
        for version in ["0.31.0", "0.32.0", "0.33.1", "", "x"] {
            let code = CodeUnderTest::vllm(version);
            assert!(code.release().is_none(), "{version}");
            assert_eq!(code.reference_policy(), None);
            assert_eq!(code.expectations(), None);
            assert_eq!(code.policy, None);
        }
        // kvgeom's own connector is judged by its variant, not by a release.
        let own = CodeUnderTest::kvgeom(Variant::Policy(NamedPolicy::Kvgeom));
        assert_eq!(own.release().map(|r| r.version), None);
        assert_eq!(own.policy.as_deref(), Some("kvgeom"));
        assert_eq!(own.version, env!("CARGO_PKG_VERSION"));
    }

    #[test]
    fn an_unmodelled_vllm_is_compared_with_the_newest_modelled_release_before_it() {
        let nearest = |v: &str| Release::nearest_vllm(v).version;
        assert_eq!(nearest("0.34.0"), "0.34.0");
        assert_eq!(nearest("0.34.1"), "0.34.0");
        assert_eq!(nearest("0.35.0.dev12+g0123abc"), "0.34.0");
        assert_eq!(nearest("0.34.0.dev3"), "0.33.0");
        assert_eq!(nearest("0.34.0rc1"), "0.33.0");
        assert_eq!(nearest("0.33.1"), "0.33.0");
        assert_eq!(nearest("0.33.0.post1"), "0.33.0");
        assert_eq!(nearest("1.0.0"), "0.34.0");
        // Older than every modelled release: the oldest one.
        assert_eq!(nearest("0.31.0"), "0.33.0");
        // Not a number: the pinned release.
        assert_eq!(nearest("main"), Release::pinned().version);
        assert_eq!(nearest(""), Release::pinned().version);
    }

    #[test]
    fn each_release_policy_is_exactly_its_known_defects() {
        for release in &RELEASES {
            assert!(!release.defects().is_empty(), "{}", release.version);
            assert_eq!(
                policy_with(&release.defects()),
                release.policy.policy(),
                "{}",
                release.version
            );
        }
    }

    #[test]
    fn the_value_serialises_as_the_report_names_it() {
        let json = serde_json::to_value(CodeUnderTest::vllm("0.33.0")).expect("JSON");
        assert_eq!(
            json,
            serde_json::json!({
                "connector": "vllm", "version": "0.33.0",
                "policy": "vllm-0.33.0", "source": null
            })
        );
        let tree = SourceTree {
            path: "vllm".into(),
            commit: "abc".into(),
            dirty: true,
        };
        let json = serde_json::to_value(&tree).expect("JSON");
        assert_eq!(
            json,
            serde_json::json!({"path": "vllm", "commit": "abc", "dirty": true})
        );
    }
}
