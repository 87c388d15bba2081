//! The one conformance test every connector's tests call, through the one
//! sweep and explain (`src/cli/pipeline.rs`): a passing case and a failing
//! case, the failing one listed in the connector's expectations file, are
//! placed, run, judged, shrunk to a replay and explained, and one option
//! the connector does not take is refused; `kvgeom lifecycle` runs its
//! scenarios of several requests on shared pools, or says why it has none. A connector whose run differs
//! from the others' only in its options (its interpreter) passes the same
//! assertions.

use kvgeom::under_test::expectations::Expectations;
use serde_json::Value;

use super::{kvgeom_run, root, scratch, Run};

/// One case of a connector, as its commands name it.
pub struct OneCase {
    /// What `sweep` is given to run just this case.
    pub sweep: Vec<String>,
    /// What `explain` is given to run it.
    pub explain: Vec<String>,
    /// The geometry's name, prompt, prefix hit, mode and allocation: the
    /// case an expectations file lists.
    pub geometry: String,
    pub prompt: u32,
    pub mode: &'static str,
    pub alloc: &'static str,
}

impl OneCase {
    /// A case of a geometry file (`geometries/NAME.toml` or a folder's).
    pub fn geometry(file: &str, prompt: u32, mode: &'static str, alloc: &'static str) -> Self {
        let name = std::path::Path::new(file)
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let case = |prompt_option: &str| {
            vec![
                file.to_string(),
                prompt_option.to_string(),
                prompt.to_string(),
                "--mode".into(),
                mode.into(),
                "--alloc".into(),
                alloc.into(),
            ]
        };
        OneCase {
            sweep: case("--prompts"),
            explain: case("--prompt"),
            geometry: name,
            prompt,
            mode,
            alloc,
        }
    }

    /// A case of an SGLang geometry file: push, and the pages the request
    /// needs (SGLang's sweep takes no `--mode` or `--alloc`).
    pub fn sglang(file: &str, prompt: u32) -> Self {
        let OneCase { geometry, .. } = OneCase::geometry(file, prompt, "push", "mainline");
        let case = |prompt_option: &str| {
            vec![
                file.to_string(),
                prompt_option.to_string(),
                prompt.to_string(),
            ]
        };
        OneCase {
            sweep: case("--prompts"),
            explain: case("--prompt"),
            geometry,
            prompt,
            mode: "push",
            alloc: "mainline",
        }
    }

    /// A recorded trace of the case of geometry `name`.
    pub fn trace(
        file: &str,
        name: &str,
        prompt: u32,
        mode: &'static str,
        alloc: &'static str,
    ) -> Self {
        OneCase {
            sweep: vec![file.to_string()],
            explain: vec![
                file.to_string(),
                "--prompt".into(),
                prompt.to_string(),
                "--mode".into(),
                mode.into(),
                "--alloc".into(),
                alloc.into(),
            ],
            geometry: name.to_string(),
            prompt,
            mode,
            alloc,
        }
    }
}

/// The passing and the failing case of vLLM's stack that kvgeom's twin of
/// the pinned vLLM and the pinned vLLM itself are held to: a prefill
/// logical block larger than decode's (passes), and G1's with-last-token
/// pull at N=13, which 0.34.0 pairs wrong (expected/vllm-0.34.0.toml).
pub fn vllm_stack_cases() -> (OneCase, OneCase) {
    (
        OneCase::geometry(
            "geometries/gqa-prefill-logical-larger.toml",
            8,
            "pull",
            "mainline",
        ),
        OneCase::geometry(
            "geometries/g1-mla-kda-ppl3-vs-2.toml",
            13,
            "pull",
            "with-last-token",
        ),
    )
}

/// A connector under the conformance test.
pub struct Connector {
    /// Its `--connector` value.
    pub name: &'static str,
    /// Options each of its commands takes (an interpreter, a policy).
    pub options: Vec<String>,
    /// A case it passes.
    pub passing: OneCase,
    /// A case it fails, listed in `expectations`.
    pub failing: OneCase,
    /// Its expectations file, relative to the project root.
    pub expectations: &'static str,
    /// What a failing sweep prints to replay the failure: the start of a
    /// shrunk `kvgeom explain` command, or the trace that holds it.
    pub replay: &'static str,
    /// A `sweep` option it refuses (exit 2, the option named).
    pub refused: &'static [&'static str],
    /// What `kvgeom lifecycle --connector NAME` does.
    pub lifecycle: Lifecycle,
}

/// A connector's lifecycle half.
pub enum Lifecycle {
    /// It runs scenarios: kvgeom's passes 20 of one geometry.
    Runs,
    /// It has none: exit 2 before anything runs, saying this.
    Refused(&'static str),
}

/// The geometry the lifecycle step runs.
const LIFECYCLE_GEOMETRY: &str = "geometries/g5-mla-kda-mixed-kernel.toml";

impl Connector {
    fn run(&self, command: &str, case: &[String], more: &[&str]) -> Run {
        let mut args: Vec<&str> = vec![command, "--connector", self.name];
        args.extend(self.options.iter().map(String::as_str));
        args.extend(case.iter().map(String::as_str));
        args.extend(more);
        kvgeom_run(&args)
    }
}

/// Every step of the conformance test for `c`; panics naming the first
/// step that fails.
pub fn conformance(c: &Connector) {
    let name = c.name;
    // The failing case is one its expectations file lists.
    let file = root().join(c.expectations);
    let expectations = Expectations::load(&file).unwrap_or_else(|e| panic!("{name}: {e}"));
    let f = &c.failing;
    let listed = expectations.failures.iter().any(|e| {
        e.geometry == f.geometry
            && e.mode.as_deref().is_none_or(|m| m == f.mode)
            && e.alloc.as_deref().is_none_or(|a| a == f.alloc)
            && e.cases.covers(f.prompt, 0)
    });
    assert!(
        listed,
        "{name}: {} does not list {} N={} {} {}",
        c.expectations, f.geometry, f.prompt, f.mode, f.alloc
    );

    // Place, run and judge a passing case: exit 0, one passing case in
    // the JSON report.
    let passed = c.run("sweep", &c.passing.sweep, &["--format", "json"]);
    assert_eq!(
        passed.code,
        Some(0),
        "{name}: passing sweep: {}",
        passed.text
    );
    let json_start = passed.text.find('{').unwrap_or(0);
    let report: Value = serde_json::Deserializer::from_str(&passed.text[json_start..])
        .into_iter::<Value>()
        .next()
        .and_then(Result::ok)
        .unwrap_or_else(|| panic!("{name}: no JSON report: {}", passed.text));
    assert_eq!(report["schema"], "kvgeom-sweep/1", "{name}");
    let cases = report["cases"].as_array().cloned().unwrap_or_default();
    assert!(!cases.is_empty(), "{name}: the report holds no case");
    assert!(
        cases.iter().all(|c| c["passed"] == Value::Bool(true)),
        "{name}: a case of the passing sweep failed: {}",
        passed.text
    );

    // The failing case held to expectations that do not list it (a
    // driven connector is held to its release's own file by default):
    // exit 1 with a replay, which fails again.
    let none = scratch(module_path!(), name).join("no-failures.toml");
    std::fs::write(&none, "# no failure is expected\n").expect("write an expectations file");
    let none = none.display().to_string();
    let failed = c.run("sweep", &f.sweep, &["--expect", &none]);
    assert_eq!(
        failed.code,
        Some(1),
        "{name}: failing sweep: {}",
        failed.text
    );
    assert!(
        failed.text.contains("unexpected"),
        "{name}: the failure is not called unexpected: {}",
        failed.text
    );
    let replay = failed
        .text
        .lines()
        .find(|l| l.contains(c.replay))
        .unwrap_or_else(|| panic!("{name}: no replay ({}): {}", c.replay, failed.text));
    if let Some(command) = replay.trim().strip_prefix("replay: kvgeom ") {
        let words: Vec<&str> = command.split_whitespace().collect();
        let again = kvgeom_run(&words);
        assert_eq!(
            again.code,
            Some(1),
            "{name}: the shrunk replay `{command}` does not fail: {}",
            again.text
        );
    }

    // Held to its expectations file, the failure is as expected.
    let expected = c.run("sweep", &f.sweep, &["--expect", c.expectations]);
    assert_eq!(
        expected.code,
        Some(0),
        "{name}: failing sweep held to {}: {}",
        c.expectations,
        expected.text
    );
    assert!(
        expected.text.contains("as expected"),
        "{name}: {}",
        expected.text
    );

    // Explain each: exit 0 for the passing case, 1 for the failing one.
    let explained = c.run("explain", &c.passing.explain, &[]);
    assert_eq!(
        explained.code,
        Some(0),
        "{name}: explain passing: {}",
        explained.text
    );
    assert!(
        explained.text.contains(&c.passing.geometry),
        "{name}: explain does not name the case: {}",
        explained.text
    );
    let explained = c.run("explain", &f.explain, &[]);
    assert_eq!(
        explained.code,
        Some(1),
        "{name}: explain failing: {}",
        explained.text
    );

    // An option it does not take is refused, and named.
    let refused = c.run("sweep", &c.passing.sweep, c.refused);
    assert_eq!(
        refused.code,
        Some(2),
        "{name}: {:?}: {}",
        c.refused,
        refused.text
    );
    assert!(
        refused.text.contains(c.refused[0]),
        "{name}: the refusal does not name {}: {}",
        c.refused[0],
        refused.text
    );

    // Several requests at once on shared pools: through the connector's
    // lifecycle half, or refused with the reason.
    let lifecycle = kvgeom_run(&[
        "lifecycle",
        "--connector",
        name,
        LIFECYCLE_GEOMETRY,
        "--scenarios",
        "20",
        "--format",
        "json",
    ]);
    match c.lifecycle {
        Lifecycle::Runs => {
            assert_eq!(
                lifecycle.code,
                Some(0),
                "{name}: lifecycle: {}",
                lifecycle.text
            );
            let report: Value = serde_json::from_str(lifecycle.text.trim())
                .unwrap_or_else(|e| panic!("{name}: lifecycle JSON: {e}: {}", lifecycle.text));
            assert_eq!(report["schema"], "kvgeom-lifecycle/1", "{name}");
            assert_eq!(report["connector"], name, "{name}");
            assert_eq!(report["summary"]["scenarios"], 20, "{name}");
        }
        Lifecycle::Refused(why) => {
            assert_eq!(
                lifecycle.code,
                Some(2),
                "{name}: lifecycle: {}",
                lifecycle.text
            );
            let line = format!("error: --connector {name}: ");
            assert!(
                lifecycle.text.contains(&line) && lifecycle.text.contains(why),
                "{name}: the lifecycle refusal does not say `{line}...{why}`: {}",
                lifecycle.text
            );
        }
    }
}
