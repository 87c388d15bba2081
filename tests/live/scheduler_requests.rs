//! `--requests scheduler`: requests made by vLLM's own scheduler (the
//! driver's place phase), kvgeom's memory prepared for the blocks it chose,
//! and the run phase handing the workers the scheduler's metadata. The
//! tests that run vLLM need its venv; without it they print why they are
//! skipped and return.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use kvgeom::connector::NamedPolicy;
use kvgeom::geometry::Mode;
use kvgeom::live::{self, Interpreter, RequestPath, Requests};
use kvgeom::scenario::Case;
use kvgeom::scheduler::DecodeAllocation;
use kvgeom::sweep::plan;
use kvgeom::under_test::{CodeUnderTest, Release};
use kvgeom::variant::Variant;

use crate::support::{kvgeom, skip};

fn interpreter(test: &str) -> Option<Interpreter> {
    match live::find(None, Release::pinned().version) {
        Ok(mut p) => {
            p.reference = CodeUnderTest::vllm(&p.vllm_version).reference_policy();
            Some(p)
        }
        Err(why) => {
            skip(test, format_args!("no vLLM venv ({why})"));
            None
        }
    }
}

/// One case of a geometry file (the file's own sweep defaults otherwise).
fn case(file: &str, prompt_len: u32, prefix_hit: u32, allocation: DecodeAllocation) -> Case {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("geometries")
        .join(file);
    let sources = plan::load_sources(std::slice::from_ref(&path)).expect("geometry loads");
    Case {
        geometry: Arc::clone(&sources[0].geometry),
        file: Some(path),
        prompt_len,
        prefix_hit,
        mode: Mode::Pull,
        allocation,
        seed: 0,
        variant: Variant::Policy(NamedPolicy::Vllm0330),
    }
}

#[test]
fn scheduler_requests_of_with_last_token_cases_are_exit_2() {
    for command in ["sweep", "explain"] {
        let mut args = vec![
            command,
            "--connector",
            "vllm",
            "geometries/llama-gqa-prefix-cache.toml",
            "--requests",
            "scheduler",
            "--alloc",
            "with-last-token",
        ];
        if command == "explain" {
            args.extend(["--prompt", "37"]);
        }
        let out = kvgeom(&args);
        assert_eq!(out.status.code(), Some(2), "{command}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("--requests scheduler --alloc with-last-token")
                && err.contains("not of its scheduler"),
            "{command}: {err}"
        );
    }
    // Other connectors have no requests to make.
    let out = kvgeom(&[
        "sweep",
        "geometries/llama-gqa-prefix-cache.toml",
        "--requests",
        "direct",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("add --connector vllm"), "{err}");
}

/// In one batch: a prefix-cache case vLLM's scheduler makes (a one-block
/// hit) passes, names its request path, and its blocks, plan and scheduler
/// model are vLLM's scheduler's; a hit that is not whole decode blocks is
/// not reachable, counted apart (neither passed nor failed); a
/// with-last-token case runs direct.
#[test]
fn scheduler_requests_pass_name_their_path_and_count_unreachable_apart() {
    let test = "scheduler_requests_pass_name_their_path_and_count_unreachable_apart";
    let Some(python) = interpreter(test) else {
        return;
    };
    let file = "llama-gqa-prefix-cache.toml";
    let cases = vec![
        case(file, 40, 16, DecodeAllocation::Mainline),
        case(file, 40, 8, DecodeAllocation::Mainline),
        case(file, 40, 16, DecodeAllocation::WithLastToken),
    ];
    let live = live::run_sweep_requests(
        &cases,
        &[],
        &python,
        Duration::from_secs(30),
        1,
        None,
        Requests::Scheduler,
    )
    .expect("driver runs");
    let [hit, unreachable, last_token] = &live[..] else {
        panic!("{} reports", live.len());
    };
    // The scheduler's case: passed, on the scheduler path, every comparison equal.
    assert!(hit.report.passed(), "{}", hit.report.outcome.describe());
    assert_eq!(hit.request_path, RequestPath::Scheduler);
    let model = hit
        .scheduler_model
        .as_ref()
        .expect("compared with the model");
    assert!(model.equal, "{:?}", model.differences);
    assert!(hit.plan.equal, "{:?}", hit.plan.first_difference);
    assert!(hit.place_seconds.is_some());
    // Not reachable: its own outcome, neither passed nor failed.
    let o = &unreachable.report.outcome;
    assert!(o.not_reachable(), "{}", o.describe());
    assert!(
        o.describe().contains("not whole decode blocks"),
        "{}",
        o.describe()
    );
    assert!(!unreachable.report.passed() && !unreachable.report.failed());
    assert_eq!(unreachable.request_path, RequestPath::Scheduler);
    assert!(unreachable.scheduler_model.is_none());
    // with-last-token: vLLM's tests' allocation, always direct.
    assert_eq!(last_token.request_path, RequestPath::Direct);
    assert!(last_token.scheduler_model.is_none());
    assert!(
        last_token.report.passed(),
        "{}",
        last_token.report.outcome.describe()
    );
    // Counted apart: two passed, none failed.
    let passed = live.iter().filter(|l| l.report.passed()).count();
    let failed = live.iter().filter(|l| l.report.failed()).count();
    assert_eq!((passed, failed), (2, 0));
}

/// The command line: the sweep's JSON names each case's request path and
/// the scheduler model's comparison; the traces it records name the path,
/// and a scheduler case's trace replays (for the scheduler's blocks).
#[test]
fn the_command_line_names_the_request_path() {
    let test = "the_command_line_names_the_request_path";
    if interpreter(test).is_none() {
        return;
    }
    let traces = std::env::temp_dir().join(format!("kvgeom-sched-traces-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&traces);
    let out = kvgeom(&[
        "sweep",
        "--connector",
        "vllm",
        "geometries/llama-gqa-prefix-cache.toml",
        "--prompts",
        "40",
        "--mode",
        "pull",
        "--format",
        "json",
        "--record-traces",
        traces.to_str().expect("a UTF-8 temporary folder"),
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    let cases = doc["cases"].as_array().expect("cases");
    assert!(!cases.is_empty());
    for c in cases {
        let want = match c["allocation"].as_str() {
            Some("mainline") => "scheduler",
            _ => "direct",
        };
        assert_eq!(c["request_path"], want, "{c}");
        if want == "scheduler" {
            assert_eq!(c["scheduler_model"]["equal"], true, "{c}");
        }
    }
    // Each recorded trace names its path; the scheduler's replay.
    let mut scheduler_traces = Vec::new();
    for entry in std::fs::read_dir(&traces).expect("traces recorded") {
        let path = entry.expect("listed").path();
        let name = path.to_string_lossy().into_owned();
        if !name.ends_with(".trace.json.gz") {
            continue;
        }
        let mut text = String::new();
        std::io::Read::read_to_string(
            &mut flate2::read::GzDecoder::new(std::fs::File::open(&path).expect("opens")),
            &mut text,
        )
        .expect("gzip");
        let trace: serde_json::Value = serde_json::from_str(&text).expect("JSON");
        let path_named = trace["result"]["request_path"].as_str().map(str::to_string);
        if name.contains("-mainline-") {
            assert_eq!(path_named.as_deref(), Some("scheduler"), "{name}");
            assert_eq!(trace["case"]["requests"], "scheduler", "{name}");
            scheduler_traces.push(name);
        } else {
            assert_eq!(path_named.as_deref(), Some("direct"), "{name}");
            assert!(trace["case"].get("requests").is_none(), "{name}");
        }
    }
    assert!(!scheduler_traces.is_empty());
    let mut args = vec!["check-trace"];
    args.extend(scheduler_traces.iter().map(String::as_str));
    let out = kvgeom(&args);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&traces);
    assert_eq!(out.status.code(), Some(0), "{text}");
}
