//! `kvgeom lifecycle` as a user runs it: kvgeom's connector passes, a
//! lifecycle variant fails (exit 1) with a shrunk scenario whose replay
//! command prints the timeline where the oracle fired, the JSON report
//! carries its schema, and bad input is exit 2 with one line.

use crate::support::{kvgeom, text};

const G5: &str = "geometries/g5-mla-kda-mixed-kernel.toml";

#[test]
fn kvgeom_passes_and_a_variant_fails_shrinks_and_replays() {
    let o = kvgeom(&["lifecycle", G5, "--scenarios", "40"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("40 scenarios"), "{}", text(&o));

    let o = kvgeom(&[
        "lifecycle",
        G5,
        "--scenarios",
        "40",
        "--variant",
        "lifecycle-abort-reuse-in-flight",
        "--format",
        "json",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(report["schema"], "kvgeom-lifecycle/1");
    assert_eq!(report["variant"], "lifecycle-abort-reuse-in-flight");
    assert_eq!(report["connector"], "kvgeom");
    let failure = &report["geometries"][0]["first_failure"];
    assert!(
        failure["shrunk"].as_array().unwrap().len() <= 8,
        "{failure}"
    );
    let replay = failure["replay"].as_str().unwrap();
    let args: Vec<&str> = replay.split_whitespace().skip(1).collect();
    let o = kvgeom(&args);
    assert_eq!(o.status.code(), Some(1), "{replay}: {}", text(&o));
    let timeline = text(&o);
    assert!(timeline.contains("(shrunk from"), "{timeline}");
    assert!(timeline.contains("!! release:"), "{timeline}");
    assert!(timeline.contains("!! isolation:"), "{timeline}");
    // The same scenario on kvgeom's own connector passes.
    let seed = failure["scenario_seed"].to_string();
    let o = kvgeom(&["lifecycle", G5, "--replay", &seed]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("every oracle passed"));
}

#[test]
fn defects_lists_the_lifecycle_variants() {
    let o = kvgeom(&["defects"]);
    assert_eq!(o.status.code(), Some(0));
    for v in &kvgeom::lifecycle::LIFECYCLE_VARIANTS {
        assert!(text(&o).contains(v.name), "{}", v.name);
        assert!(text(&o).contains(v.cites), "{}", v.cites);
    }
}

#[test]
fn bad_lifecycle_input_is_exit_2_with_one_line() {
    for (args, says) in [
        (vec!["lifecycle", G5, "--scenarios", "0"], "--scenarios 0"),
        (vec!["lifecycle", G5, "--requests", "65"], "--requests 65"),
        (
            vec!["lifecycle", G5, "--variant", "nope"],
            "unknown lifecycle variant",
        ),
        (
            vec!["lifecycle", G5, "--no-shrink"],
            "--no-shrink applies to --replay only",
        ),
        (
            vec![
                "lifecycle",
                G5,
                "geometries/deepseek-mla.toml",
                "--replay",
                "1",
            ],
            "--replay takes one geometry file",
        ),
        (
            vec!["lifecycle", "geometries/reject-g1-prefix-caching.toml"],
            "no geometry given has a lifecycle kvgeom models",
        ),
        (vec!["lifecycle", "no-such-file.toml"], "no-such-file.toml"),
        // A connector without a lifecycle half says so before reading
        // anything, with or without its venv.
        (
            vec!["lifecycle", "--connector", "vllm", "no-such-file.toml"],
            "--connector vllm: its driver runs one request per case",
        ),
        (
            vec!["lifecycle", "--connector", "sglang"],
            "--connector sglang: its driver runs one request per case",
        ),
    ] {
        let o = kvgeom(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        assert!(text(&o).contains(says), "{args:?}: {}", text(&o));
    }
}
