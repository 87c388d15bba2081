//! v2 traces of vLLM releases other than 0.33.0 (whose fixtures
//! `trace_v2.rs` holds): each release's own connector recorded live on the
//! cases whose verdict changed from the release before it
//! (`scripts/record-live-trace-fixtures.sh --release X`). `diff-trace
//! --policy vllm-X` must hold each trace (kvgeom's twin of the release
//! plans what the release did), and `--policy` of the release before must
//! differ on it (the twin of the older release does not).
//!
//! The fixtures need no venv.

use std::io::Read;
use std::path::{Path, PathBuf};

use serde_json::Value;

/// A release's fixtures: its folder, its policy, the policy of the release
/// before it, and each fixture with check-trace's verdict on it.
struct ReleaseFixtures {
    version: &'static str,
    policy: &'static str,
    before: &'static str,
    fixtures: &'static [(&'static str, &'static str)],
}

const RELEASES: &[ReleaseFixtures] = &[ReleaseFixtures {
    version: "0.34.0",
    policy: "vllm-0.34.0",
    before: "vllm-0.33.0",
    fixtures: &[
        // Last-token pairing: 0.34.0 pairs decode's with-last-token
        // allocation from its first block (docs/findings/
        // vllm-0.34.0-last-token-pairing.md); 0.33.0 passed.
        (
            "g1-mla-kda-ppl3-vs-2-pull-n13-hit0-with-last-token-s0",
            "violations",
        ),
        // 0.33.0's end-trimmed alignment (docs/findings/
        // vllm-0.33.0-end-trim-alignment.md) is gone in 0.34.0: an equal-ppl
        // hybrid with a kernel ratio and a prefix hit, and a pair whose
        // logical blocks differ on one kernel block.
        (
            "mla-kda-kernel-ratio-equal-ppl-prefix-cache-pull-n21-hit16-mainline-s0",
            "passed",
        ),
        (
            "gqa-prefill-logical-larger-pull-n8-hit0-mainline-s0",
            "passed",
        ),
        // Decode's logical block larger than prefill's: 0.33.0 crashed.
        (
            "mla-decode-logical-larger-pull-n9-hit0-mainline-s0",
            "passed",
        ),
        // Push with different block sizes: 0.34.0's decode refuses the pair
        // (docs/findings/vllm-0.34.0-push-identical-block-sizes.md); 0.33.0
        // crashed.
        (
            "mla-kda-push-prefix-cache-prefill-kernel-larger-push-n13-hit0-mainline-s0",
            "rejected",
        ),
    ],
}];

fn fixture(release: &ReleaseFixtures, name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join(format!(
            "tests/fixtures/live-traces-vllm-{}",
            release.version
        ))
        .join(format!("{name}.trace.json.gz"))
}

/// check-trace's or diff-trace's (verdict, message) of `file`.
fn verdict(args: &[&str], file: &Path) -> (String, String) {
    let (verdict, message, _) = crate::trace_v2::verdict(args, file);
    (verdict, message)
}

#[test]
fn each_release_policy_holds_its_traces_and_the_release_before_differs() {
    for release in RELEASES {
        for &(name, check) in release.fixtures {
            let file = fixture(release, name);
            let (v, message) = verdict(&["check-trace"], &file);
            assert_eq!(v, check, "check-trace {name}: {message}");
            let (v, message) = verdict(&["diff-trace", "--policy", release.policy], &file);
            assert_eq!(
                v, "match",
                "diff-trace --policy {} {name}: {message}",
                release.policy
            );
            let (v, message) = verdict(&["diff-trace", "--policy", release.before], &file);
            assert_eq!(
                v, "differ",
                "diff-trace --policy {} {name}: the verdict changed between the releases, so the older twin's plan must differ: {message}",
                release.before
            );
        }
    }
}

#[test]
fn each_fixture_records_its_release_and_is_pinned() {
    for release in RELEASES {
        let dir = fixture(release, "x").parent().unwrap().to_path_buf();
        let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                e.file_name()
                    .to_str()
                    .and_then(|n| n.strip_suffix(".trace.json.gz"))
                    .map(str::to_string)
            })
            .collect();
        on_disk.sort();
        let mut pinned: Vec<String> = release
            .fixtures
            .iter()
            .map(|(n, _)| n.to_string())
            .collect();
        pinned.sort();
        assert_eq!(
            on_disk,
            pinned,
            "{}: every fixture has its verdicts",
            dir.display()
        );
        for &(name, _) in release.fixtures {
            let bytes = std::fs::read(fixture(release, name)).expect("fixture");
            let mut text = Vec::new();
            flate2::read::GzDecoder::new(&bytes[..])
                .read_to_end(&mut text)
                .expect("gzip");
            let trace: Value = serde_json::from_slice(&text).expect("JSON");
            assert_eq!(trace["vllm_version"], release.version, "{name}");
        }
    }
}
