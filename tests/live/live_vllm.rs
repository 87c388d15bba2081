//! `--connector vllm`: vLLM's own NIXL connector under kvgeom's oracles.
//!
//! The tests that run vLLM need its venv (`scripts/install-vllm.sh`, or an
//! interpreter named by `KVGEOM_VLLM_PYTHON`); without it they print why
//! they are skipped and return. The refusals and the missing-venv error
//! need no venv.

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::Duration;

use kvgeom::connector::NamedPolicy;
use kvgeom::geometry::Mode;
use kvgeom::layout::Side;
use kvgeom::live::LiveReport;
use kvgeom::live::{self, Interpreter};
use kvgeom::oracle;
use kvgeom::scenario::{Case, Outcome, RunOptions};
use kvgeom::scheduler::DecodeAllocation;
use kvgeom::sweep::plan;
use kvgeom::under_test::expectations::Expectations;
use kvgeom::under_test::run_case;
use kvgeom::under_test::{CodeUnderTest, Release};
use kvgeom::variant::Variant;

use crate::support::{
    kvgeom, kvgeom_with_env, python_with_site, skip, vllm_install_command, vllm_venv_python,
};

/// The pinned release's interpreter (`.vllm-venv/`, or
/// `KVGEOM_VLLM_PYTHON`), or `None` after printing why the test is skipped.
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

/// vLLM `version`'s interpreter where `scripts/install-vllm.sh` puts it
/// (a test of that release's known behaviour), or `None` after printing
/// why the test is skipped.
fn interpreter_of(test: &str, version: &str) -> Option<Interpreter> {
    let python = vllm_venv_python(version);
    if !python.exists() {
        skip(
            test,
            format_args!(
                "vLLM {version} is not installed at {} (run {})",
                python.display(),
                vllm_install_command(version)
            ),
        );
        return None;
    }
    match live::find(Some(&python), version) {
        Ok(mut p) => {
            p.reference = CodeUnderTest::vllm(&p.vllm_version).reference_policy();
            assert_eq!(p.vllm_version, version, "{}", python.display());
            Some(p)
        }
        Err(why) => {
            skip(test, format_args!("no vLLM {version} venv ({why})"));
            None
        }
    }
}

/// `cases` planned with the policy of vLLM `version` (the cases above are
/// planned with the pinned release's; a test of another release re-plans
/// them).
fn on_release(cases: Vec<Case>, version: &str) -> Vec<Case> {
    let policy = Release::of_vllm(version)
        .expect("a modelled release")
        .policy;
    cases
        .into_iter()
        .map(|c| Case {
            variant: Variant::Policy(policy),
            ..c
        })
        .collect()
}

fn cases(file: &str, prompts: &[u32]) -> Vec<Case> {
    cases_in(file, prompts, Mode::Pull)
}

fn cases_in(file: &str, prompts: &[u32], mode: Mode) -> Vec<Case> {
    cases_of(file, prompts, mode, DecodeAllocation::Mainline)
}

fn cases_with_allocation(file: &str, prompts: &[u32], allocation: DecodeAllocation) -> Vec<Case> {
    cases_of(file, prompts, Mode::Pull, allocation)
}

fn cases_of(file: &str, prompts: &[u32], mode: Mode, allocation: DecodeAllocation) -> Vec<Case> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("geometries")
        .join(file);
    let sources = plan::load_sources(&[path]).expect("geometry loads");
    plan::grid(
        &sources,
        &plan::PlanOptions {
            prompts: Some(prompts.to_vec()),
            modes: vec![mode],
            allocations: Some(vec![allocation]),
            variant: Variant::Policy(Release::pinned().policy),
            seed: 0,
        },
    )
}

fn kind(o: &Outcome) -> &'static str {
    o.label()
}

#[test]
fn missing_interpreter_is_exit_2_naming_the_install_script() {
    let out = kvgeom(&[
        "sweep",
        "--connector",
        "vllm",
        "--vllm-python",
        "/nonexistent/bin/python",
        "geometries/deepseek-mla.toml",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("scripts/install-vllm.sh"), "{err}");
    assert!(err.contains("/nonexistent/bin/python"), "{err}");
}

#[test]
fn options_that_do_not_apply_are_refused() {
    for (args, word) in [
        (&["--defect", "two-path-zeroing"][..], "--defect"),
        (&["--memory", "vram"][..], "--memory vram"),
        (&["--transport", "nixl"][..], "--transport nixl"),
        (&["--policy", "kvgeom"][..], "--policy"),
        (&["--threads", "0"][..], "--threads 0: give at least 1"),
        (
            &["--max-memory", "1K"][..],
            "more than --max-memory 1.0 KiB; ",
        ),
        (
            &["--shard", "3/2"][..],
            "--shard `3/2`: expected K/N with 1 <= K <= N",
        ),
    ] {
        let mut all = vec![
            "sweep",
            "--connector",
            "vllm",
            "geometries/deepseek-mla.toml",
        ];
        all.extend_from_slice(args);
        let out = kvgeom(&all);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(word), "{args:?}: {err}");
    }
}

/// A handful of cases end to end: vLLM's verdict and plan agree with
/// kvgeom's `--policy vllm-0.33.0` reproduction, and the oracles judged
/// memory vLLM's worker wrote.
#[test]
fn vllm_agrees_with_the_reproduction_on_a_handful_of_cases() {
    let Some(python) = interpreter("vllm_agrees_with_the_reproduction_on_a_handful_of_cases")
    else {
        return;
    };
    let mut all = cases("deepseek-mla.toml", &[65, 129]);
    all.extend(cases("gqa-kernel-ratio4.toml", &[5]));
    all.extend(cases("llama-gqa-prefix-cache.toml", &[37]));
    all.extend(cases("mla-decode-logical-larger.toml", &[3]));
    all.extend(cases("gqa-prefill-logical-larger.toml", &[5]));
    assert!(all.len() >= 6);
    let live = live::run_batch(&all, &python, Duration::from_secs(30)).expect("driver runs");
    assert_eq!(live.len(), all.len());
    let mut moved = 0;
    for (case, l) in all.iter().zip(&live) {
        let label = format!(
            "{} N={} h={}",
            case.geometry_name(),
            case.prompt_len,
            case.prefix_hit
        );
        let reference = run_case(case, &RunOptions::default());
        assert!(l.plan.equal, "{label}: {:?}", l.plan.first_difference);
        assert_eq!(
            kind(&l.report.outcome),
            kind(&reference.outcome),
            "{label}: vLLM {} / kvgeom {}",
            l.report.outcome.describe(),
            reference.outcome.describe()
        );
        let got: Vec<_> = l.report.violations.iter().map(|v| v.oracle).collect();
        let want: Vec<_> = reference.violations.iter().map(|v| v.oracle).collect();
        let (mut got, mut want) = (got, want);
        got.sort();
        got.dedup();
        want.sort();
        want.dedup();
        assert_eq!(got, want, "{label}");
        if let Some(input) = &l.oracle_input {
            let images = input.memory(Side::Decode, 0).expect("decode memory");
            let after: Vec<Vec<u8>> = images.after.iter().map(|a| a.to_vec()).collect();
            if images.before != after.into() {
                moved += 1;
            }
        }
    }
    assert!(
        moved >= 4,
        "vLLM's final memory differs from the initial one in {moved} cases"
    );
}

/// vLLM's connector runs each case on the blocks it was placed at: given
/// the placement of another seed, the driver's request holds those blocks,
/// vLLM's transfers are the ones kvgeom's connector plans for them (not for
/// the case's own placement), and the bytes pass every oracle.
#[test]
fn vllm_runs_the_placement_it_is_given() {
    use kvgeom::live::VllmConnector;
    use kvgeom::live::{DriverSettings, Hooks};
    use kvgeom::scenario::shape_and_place;
    use kvgeom::under_test::judge::plan_keys;
    use kvgeom::under_test::{judge, run_case_detailed, ConnectorUnderTest};

    let Some(python) = interpreter("vllm_runs_the_placement_it_is_given") else {
        return;
    };
    let case = cases("llama-gqa-prefix-cache.toml", &[37]).remove(0);
    let elsewhere = Case {
        seed: case.seed + 7,
        ..case.clone()
    };
    let plan_at = |c: &Case| {
        let run = run_case_detailed(c, &RunOptions::default());
        plan_keys(run.oracle_input.as_ref().expect("kvgeom's run completes"))
    };
    let (own, other) = (plan_at(&case), plan_at(&elsewhere));
    assert_ne!(own, other, "the two seeds place the request alike");
    let hooks = Hooks::default();
    let connector = VllmConnector {
        driver: DriverSettings {
            python: &python,
            checks: &[],
            case_limit: Duration::from_secs(30),
            hooks: &hooks,
            drivers: 1,
        },
    };
    let (_, placement) = shape_and_place(&elsewhere).expect("placed");
    let judged = connector
        .run(
            std::slice::from_ref(&case),
            vec![shape_and_place(&elsewhere)],
            &|record| {
                let input = record.run.observed.as_ref().expect("vLLM completed");
                let blocks = input.case.blocks().clone();
                (blocks, plan_keys(input), judge(&record.run))
            },
        )
        .expect("driver runs");
    let (blocks, plan, report) = &judged[0];
    assert_eq!(blocks.decode, placement.decode);
    assert_eq!(blocks.prefill, placement.prefill);
    assert_eq!(
        plan, &other,
        "vLLM moved what kvgeom plans for the given blocks"
    );
    assert!(report.passed(), "{}", report.outcome.describe());
}

/// Hybrids (attention + mamba state) on vLLM's real pull worker, in one
/// driver process: MLA + KDA with different ppl on P and D, GQA + Mamba2,
/// GQA + Mamba1, GQA + GDN with D_TP > P_TP, and two cases where vLLM
/// 0.33.0 is known to be wrong: a replicated Mamba2 B/C group (it reads the
/// wrong bytes) and MLA + KDA prefix hits under the with-last-token
/// allocation (end-trim alignment). Each verdict, each violated oracle and
/// each plan must be the ones kvgeom's `--policy vllm-0.33.0` reproduction
/// gives, and vLLM must have moved mamba state. A hybrid the driver cannot
/// build is refused per case, naming what it lacks, without stopping the
/// batch.
#[test]
fn hybrids_on_vllm_agree_with_the_reproduction() {
    let Some(python) = interpreter("hybrids_on_vllm_agree_with_the_reproduction") else {
        return;
    };
    let mut all = cases("g1-mla-kda-ppl3-vs-2.toml", &[5, 13]);
    all.extend(cases("nemotron-h-gqa-mamba2-hnd.toml", &[9]));
    all.extend(cases("jamba-gqa-mamba1.toml", &[17]));
    all.extend(cases("qwen3-next-gqa-gdn-decode-tp2.toml", &[20]));
    all.extend(cases("mamba2-replicated-groups-p1-d2.toml", &[5]));
    all.extend(cases_with_allocation(
        "mla-kda-equal-ppl-prefix-cache.toml",
        &[33],
        DecodeAllocation::WithLastToken,
    ));
    // expected/vllm-0.33.0.toml: vllm-0.33.0-replicated-mamba2-groups.md
    // and vllm-0.33.0-end-trim-alignment.md#1 (33/16, with-last-token).
    let known_failures = [
        ("mamba2-replicated-groups-p1-d2", 5, 0),
        ("mla-kda-equal-ppl-prefix-cache", 33, 16),
    ];
    let unbuildable = all.len();
    all.extend(unbuildable_kda_cases());
    let live = live::run_batch(&all, &python, Duration::from_secs(30)).expect("driver runs");
    assert_eq!(live.len(), all.len());
    let mut failed_as_known = 0;
    for (case, l) in all.iter().zip(&live).take(unbuildable) {
        let label = format!(
            "{} N={} h={}",
            case.geometry_name(),
            case.prompt_len,
            case.prefix_hit
        );
        let reference = run_case(case, &RunOptions::default());
        assert!(l.plan.equal, "{label}: {:?}", l.plan.first_difference);
        assert_eq!(
            kind(&l.report.outcome),
            kind(&reference.outcome),
            "{label}: vLLM {} / kvgeom {}",
            l.report.outcome.describe(),
            reference.outcome.describe()
        );
        assert_eq!(
            violated_oracles(&l.report.violations),
            violated_oracles(&reference.violations),
            "{label}"
        );
        let input = l
            .oracle_input
            .as_ref()
            .expect("vLLM's final memory was judged");
        let state_pairs = input
            .posted_pairs()
            .filter(|p| p.destination.location.kind.name() == "mamba")
            .count();
        assert!(state_pairs > 0, "{label}: vLLM moved no mamba state");
        let known = (case.geometry_name(), case.prompt_len, case.prefix_hit);
        if known_failures.contains(&known) {
            assert_eq!(l.report.outcome, Outcome::Violations, "{label}");
            assert_eq!(
                violated_oracles(&l.report.violations),
                ["pairing", "transferred_or_zeroed"],
                "{label}"
            );
            failed_as_known += 1;
        } else {
            check_healthy(l, &label);
        }
    }
    assert_eq!(failed_as_known, known_failures.len());
    let refused = &live[unbuildable];
    let Outcome::Error { message } = &refused.report.outcome else {
        panic!(
            "expected a driver error, got {}",
            refused.report.outcome.describe()
        );
    };
    assert!(
        message.contains("the driver cannot build this case")
            && message.contains("Q (1) and K (2) of different widths"),
        "{message}"
    );
    assert!(!message.contains("Traceback"), "{message}");
    assert!(!refused.plan.equal);
}

/// A KDA hybrid whose Q and K differ in width (allowed by the geometry
/// format for KDA, not by vLLM 0.33.0's conv decomposition, which splits
/// Q | K evenly).
fn unbuildable_kda_cases() -> Vec<Case> {
    let text = r#"
description = "MLA + KDA with Q narrower than K"
[model]
layer_slots = 1
groups = ["attention", "mamba"]
[model.attention]
kind = "mla"
head_size = 6
dtype_bytes = 2
[model.mamba]
kind = "kda"
conv_dims = [2, 4, 4]
conv_rows = 3
conv_dtype_bytes = 2
ssm_state_bytes = 64
[prefill]
tp_size = 2
kernel_block = 4
logical_block = 8
[decode]
tp_size = 2
kernel_block = 4
logical_block = 8
"#;
    let dir = std::env::temp_dir().join(format!("kvgeom-live-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("kda-unequal-q-k.toml");
    std::fs::write(&path, text).expect("write geometry");
    let sources = plan::load_sources(&[path]).expect("geometry loads");
    let _ = std::fs::remove_dir_all(&dir);
    plan::grid(
        &sources,
        &plan::PlanOptions {
            prompts: Some(vec![5]),
            modes: vec![Mode::Pull],
            allocations: Some(vec![DecodeAllocation::Mainline]),
            variant: Variant::Policy(NamedPolicy::Vllm0330),
            seed: 0,
        },
    )
}

fn violated_oracles(violations: &[kvgeom::oracle::Violation]) -> Vec<&'static str> {
    let mut names: Vec<_> = violations.iter().map(|v| v.oracle).collect();
    names.sort();
    names.dedup();
    names
}

/// A fault that only the bytes reveal: with vLLM's receive post-process
/// skipped, its transfers are still the right ones (plan equal, descriptor
/// oracles clean), but decode's pages keep what the READs left (prefill's
/// sub-block layout, bytes the post-process would have zeroed); only the
/// byte-level oracles, run on vLLM's real final memory, see it.
#[test]
fn only_the_bytes_reveal_a_skipped_receive_post_process() {
    let Some(python) = interpreter("only_the_bytes_reveal_a_skipped_receive_post_process") else {
        return;
    };
    let mut all = cases("gqa-kernel-ratio4.toml", &[5, 16]);
    // Hybrids: vLLM's post-process works on the attention views of the
    // tensors the mamba state shares; skipping it shows in their bytes too.
    all.extend(cases("g1-mla-kda-ppl3-vs-2.toml", &[5]));
    all.extend(cases("nemotron-h-gqa-mamba2-hnd.toml", &[9]));
    let healthy = live::run_batch(&all, &python, Duration::from_secs(30)).expect("driver runs");
    let faulty =
        live::run_batch_with(&all, &python, Duration::from_secs(30), true).expect("driver runs");
    for (ok, bad) in healthy.iter().zip(&faulty) {
        let label = format!(
            "{} N={}",
            ok.report.case.geometry_name(),
            ok.report.case.prompt_len
        );
        check_healthy(ok, &label);
        assert!(bad.plan.equal, "{label}: {:?}", bad.plan.first_difference);
        let input = bad.oracle_input.as_ref().expect("oracle input");
        assert!(
            oracle::run_descriptor_level(input).is_empty(),
            "{label}: descriptor-level oracles must not see the fault"
        );
        assert_eq!(bad.report.outcome, Outcome::Violations, "{label}");
        assert!(
            bad.report
                .violations
                .iter()
                .any(|v| v.oracle == "transferred_or_zeroed"),
            "{label}: {:?}",
            bad.report.violations
        );
    }
}

fn check_healthy(l: &LiveReport, label: &str) {
    assert!(
        l.report.passed(),
        "{label}: {}",
        l.report.outcome.describe()
    );
    assert!(l.report.violations.is_empty(), "{label}");
}

#[test]
fn explain_with_vllm_refuses_kvgeom_variants_and_names_a_missing_venv() {
    let out = kvgeom(&[
        "explain",
        "geometries/deepseek-mla.toml",
        "--prompt",
        "65",
        "--connector",
        "vllm",
        "--policy",
        "kvgeom",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let out = kvgeom(&[
        "explain",
        "geometries/deepseek-mla.toml",
        "--prompt",
        "65",
        "--connector",
        "vllm",
        "--vllm-python",
        "/nonexistent/python",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("scripts/install-vllm.sh"));
}

/// `--shard K/N` on a live sweep: the shards' JSON reports merge into the
/// unsharded report byte for byte; a failure is shrunk to a minimal replay
/// on vLLM's connector (and `--no-shrink` keeps the case as run).
#[test]
fn live_shards_merge_into_the_whole_and_failures_shrink() {
    let Some(python) = interpreter_of(
        "live_shards_merge_into_the_whole_and_failures_shrink",
        "0.33.0",
    ) else {
        return;
    };
    // Named on the command line (the project's venv holds the pinned
    // release), so every replay names it too.
    let named = std::path::absolute(&python.python).unwrap();
    let python_path = named.to_string_lossy().to_string();
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("live-shards");
    std::fs::create_dir_all(&dir).unwrap();
    // No expectations: 0.33.0's dead-block pairing fails N = 5 and 6 (and
    // every shorter prompt, so the shrink reaches N = 1).
    let none = dir.join("no-expectations.toml");
    std::fs::write(&none, "# nothing expected\n").unwrap();
    let base = |extra: &[&str]| -> Output {
        let mut args = vec![
            "sweep",
            "--connector",
            "vllm",
            "--mode",
            "pull",
            "geometries/gqa-prefill-logical-larger.toml",
            "--prompts",
            "5,6",
            "--expect",
            none.to_str().unwrap(),
            "--format",
            "json",
            "--vllm-python",
            &python_path,
        ];
        args.extend_from_slice(extra);
        kvgeom(&args)
    };
    let whole = base(&[]);
    assert_eq!(whole.status.code(), Some(1));
    // What ran: vLLM at the driver's version, judged as its release's policy.
    let report: serde_json::Value = serde_json::from_slice(&whole.stdout).expect("a JSON report");
    let vllm_code = serde_json::json!({
        "connector": "vllm",
        "version": python.vllm_version,
        "policy": "vllm-0.33.0",
        "source": null,
    });
    assert_eq!(report["code_under_test"], vllm_code, "{report}");
    for case in report["cases"].as_array().expect("cases") {
        assert_eq!(case["code_under_test"], vllm_code, "{case}");
        assert_eq!(case["connector"], "vllm");
    }
    let err = String::from_utf8_lossy(&whole.stderr);
    assert!(
        err.contains(&format!(
            "replay: kvgeom explain geometries/gqa-prefill-logical-larger.toml --prompt 1 --prefix-hit 0 \
             --mode pull --alloc mainline --seed 0 --connector vllm --vllm-python {}\n",
            named.display()
        )),
        "{err}"
    );
    // Each shard runs unshrunk: its replay names the case as run, and the
    // interpreter (else a replay would run the project's venv).
    let mut shards = Vec::new();
    for shard in ["1/2", "2/2"] {
        let out = dir.join(format!("shard-{}.json", &shard[..1]));
        let run = base(&[
            "--shard",
            shard,
            "--no-shrink",
            "--out",
            out.to_str().unwrap(),
        ]);
        assert_eq!(run.status.code(), Some(1), "{shard}");
        let err = String::from_utf8_lossy(&run.stderr);
        assert!(
            err.contains(&format!("shard {shard}: 1 of 2 cases")),
            "{err}"
        );
        let as_run = ["5", "6"].map(|n| {
            format!(
                "--prompt {n} --prefix-hit 0 --mode pull --alloc mainline --seed 0 --connector vllm \
                 --vllm-python {}\n",
                named.display()
            )
        });
        assert!(
            as_run.iter().any(|line| err.contains(line.as_str())),
            "not the case as run, or no interpreter named: {err}"
        );
        shards.push(out);
    }
    let merged = kvgeom(&[
        "report",
        "merge",
        shards[0].to_str().unwrap(),
        shards[1].to_str().unwrap(),
    ]);
    assert_eq!(merged.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&merged.stdout),
        String::from_utf8_lossy(&whole.stdout)
    );
}

/// `--threads N` runs N driver processes at once: the same report, case for
/// case and in the same order, as one process.
#[test]
fn several_driver_processes_give_the_report_of_one() {
    if interpreter("several_driver_processes_give_the_report_of_one").is_none() {
        return;
    }
    let run = |threads: &str| -> Output {
        kvgeom(&[
            "sweep",
            "--connector",
            "vllm",
            "geometries/gqa-prefill-logical-larger.toml",
            "geometries/deepseek-mla.toml",
            "--prompts",
            "5,6,17",
            "--no-shrink",
            "--threads",
            threads,
            "--format",
            "json",
        ])
    };
    let one = run("1");
    let three = run("3");
    assert_eq!(one.status.code(), three.status.code());
    let cases = |out: &Output| -> Vec<serde_json::Value> {
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("a JSON report");
        doc["cases"].as_array().expect("cases").clone()
    };
    let (a, b) = (cases(&one), cases(&three));
    assert_eq!(a.len(), 12, "{}", String::from_utf8_lossy(&one.stderr));
    assert_eq!(a, b);
    let err = String::from_utf8_lossy(&three.stderr);
    assert!(err.contains("12 cases in"), "{err}");
}

/// Another vLLM (a branch, a pull request) that lacks what the driver
/// drives: the sweep is exit 2 naming every missing class and method. A
/// stand-in `vllm` package without the NIXL connector plays that vLLM, so
/// the test needs only a Python 3, not the venv.
#[test]
fn a_vllm_without_the_connector_classes_is_named_exit_2() {
    let Some(python3) = ["python3", "python"].into_iter().find(|p| {
        Command::new(p)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    }) else {
        skip(
            "a_vllm_without_the_connector_classes_is_named_exit_2",
            "no python3",
        );
        return;
    };
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("fake-vllm");
    let site = dir.join("site");
    let package = site.join("vllm");
    let config = package.join("config");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::create_dir_all(site.join("vllm-0.0.1.dist-info")).unwrap();
    std::fs::write(package.join("__init__.py"), "__version__ = '0.0.1'\n").unwrap();
    // vllm.config imports but has no VllmConfig; everything else is absent.
    std::fs::write(config.join("__init__.py"), "class ModelConfig: pass\n").unwrap();
    std::fs::write(
        site.join("vllm-0.0.1.dist-info").join("METADATA"),
        "Metadata-Version: 2.1\nName: vllm\nVersion: 0.0.1\n",
    )
    .unwrap();
    let wrapper = python_with_site(&dir, &site, python3);
    let sweep = |requests: &str| {
        kvgeom(&[
            "sweep",
            "--connector",
            "vllm",
            "--vllm-python",
            wrapper.to_str().unwrap(),
            "--mode",
            "pull",
            "--prompts",
            "3",
            "--requests",
            requests,
            "geometries/deepseek-mla.toml",
        ])
    };
    // Requests made by vLLM's scheduler: the place phase names what it lacks.
    let out = sweep("scheduler");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    for needed in [
        "lacks what the driver needs:",
        "  - vllm.config.SchedulerConfig.get_scheduler_cls (the scheduler class the engine core runs)",
    ] {
        assert!(err.contains(needed), "{needed:?} not in: {err}");
    }
    // Direct requests: the run phase names every worker piece it lacks.
    let out = sweep("direct");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    for needed in [
        "vLLM 0.0.1 (",
        "lacks what the driver needs:",
        "  - vllm.distributed.kv_transfer.kv_connector.v1.nixl.worker (the module does not import: ModuleNotFoundError",
        "vLLM's own import failed; the driver needs from it: NixlConnectorWorker: the pull worker; NixlConnectorWorker.register_kv_caches: registration;",
        "NixlConnectorWorker._read_blocks_for_req: planning a pull;",
        "  - vllm.config.VllmConfig (the engine config)\n",
        "  - vllm.v1.worker.utils (the module does not import",
        "allocate_kv_cache: allocating the caches as vLLM does",
    ] {
        assert!(err.contains(needed), "{needed:?} not in: {err}");
    }
    assert!(!err.contains("vllm.config.ModelConfig"), "{err}");
    // One line per module that does not import; a pull sweep needs no push worker.
    assert_eq!(err.matches("nixl.worker (the module").count(), 1, "{err}");
    assert!(!err.contains("push_worker"), "{err}");
}

/// The expectations of vLLM `version` (a modelled release), without their
/// message texts (vLLM words its exceptions differently from kvgeom's
/// reproduction).
fn expectations(version: &str) -> Expectations {
    let release = Release::of_vllm(version).expect("a modelled release");
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(release.expectations);
    let mut e = Expectations::load(&path).expect("expectations load");
    for f in &mut e.failures {
        f.message = None;
    }
    e
}

fn label(case: &Case) -> String {
    format!(
        "{} N={} h={} {}",
        case.geometry_name(),
        case.prompt_len,
        case.prefix_hit,
        case.mode.as_str()
    )
}

/// vLLM's live verdict against kvgeom's `--policy vllm-0.33.0` run of the
/// same case: outcome kind, oracle set and plan.
fn check_against_reproduction(case: &Case, l: &LiveReport) {
    let label = label(case);
    let reference = run_case(case, &RunOptions::default());
    assert!(l.plan.equal, "{label}: {:?}", l.plan.first_difference);
    assert_eq!(
        kind(&l.report.outcome),
        kind(&reference.outcome),
        "{label}: vLLM {} / kvgeom {}",
        l.report.outcome.describe(),
        reference.outcome.describe()
    );
    let mut got: Vec<_> = l.report.violations.iter().map(|v| v.oracle).collect();
    let mut want: Vec<_> = reference.violations.iter().map(|v| v.oracle).collect();
    got.sort();
    got.dedup();
    want.sort();
    want.dedup();
    assert_eq!(got, want, "{label}");
}

/// The pinned 0.34.0's push on the same cases: it refuses every P/D block
/// size difference at decode's handshake (`NotImplementedError`, where
/// 0.33.0 hung or crashed), still pushes equal geometries right, and every
/// verdict and plan is kvgeom's `--policy vllm-0.34.0`'s and
/// expected/vllm-0.34.0.toml's.
#[test]
fn the_pinned_push_refuses_block_size_differences_at_the_handshake() {
    let Some(python) =
        interpreter("the_pinned_push_refuses_block_size_differences_at_the_handshake")
    else {
        return;
    };
    let push = |file: &str, prompts: &[u32]| cases_in(file, prompts, Mode::Push);
    let mut all = push("llama-gqa-prefix-cache.toml", &[37]);
    all.extend(push("gqa-kernel-ratio4.toml", &[5]));
    all.extend(push("gqa-prefill-logical-larger.toml", &[5]));
    all.extend(push("mla-decode-logical-larger.toml", &[3]));
    let live = live::run_batch(&all, &python, Duration::from_secs(30)).expect("driver runs");
    assert_eq!(live.len(), all.len());
    let expected = expectations(&python.vllm_version);
    for (case, l) in all.iter().zip(&live) {
        let label = label(case);
        check_against_reproduction(case, l);
        let disagreements = expected.compare(std::slice::from_ref(&l.report));
        assert!(disagreements.is_empty(), "{label}: {disagreements:?}");
        let text = l.report.outcome.describe();
        if case.geometry_name() == "llama-gqa-prefix-cache" {
            assert!(l.report.passed(), "{label}: {text}");
        } else {
            assert!(
                matches!(l.report.outcome, Outcome::UnexpectedRejection { .. }),
                "{label}: {text}"
            );
            assert!(
                text.contains("requires identical P/D block sizes"),
                "{label}: {text}"
            );
        }
    }
}

/// Push mode on vLLM's real push workers: where 0.33.0 push is right
/// (equal TP-compatible GQA with prefix caching), where it writes the same
/// bytes twice (MLA with P TP > D TP: right, 2x redundant writes), where
/// prefill's handshake refuses and decode
/// waits forever (hung, with what was pending), and where decode's or
/// prefill's push path raises. Each verdict and plan is pinned, against
/// kvgeom's reproduction and against expected/vllm-0.33.0.toml.
#[test]
fn vllm_push_agrees_with_the_reproduction_and_the_expectations() {
    let Some(python) = interpreter_of(
        "vllm_push_agrees_with_the_reproduction_and_the_expectations",
        "0.33.0",
    ) else {
        return;
    };
    let push =
        |file: &str, prompts: &[u32]| on_release(cases_in(file, prompts, Mode::Push), "0.33.0");
    let mut all = push("llama-gqa-prefix-cache.toml", &[37]);
    let right = all.len();
    all.extend(push("deepseek-mla.toml", &[65]));
    all.extend(push("gqa-kernel-ratio4.toml", &[5]));
    all.extend(push("gqa-prefill-logical-larger.toml", &[5]));
    all.extend(push("mla-decode-logical-larger.toml", &[3, 13]));
    all.extend(push("g1-mla-kda-ppl3-vs-2.toml", &[29]));
    let live = live::run_batch(&all, &python, Duration::from_secs(30)).expect("driver runs");
    assert_eq!(live.len(), all.len());
    let expected = expectations("0.33.0");
    let (mut pinned, mut moved) = (0, 0);
    for (case, l) in all.iter().zip(&live) {
        let label = label(case);
        let outcome = &l.report.outcome;
        let text = outcome.describe();
        if case.geometry.model.mamba.is_some() {
            // Hybrids are refused per case until the driver builds their
            // caches; once it does, they are judged like the others.
            if let Outcome::Error { message } = outcome {
                assert!(message.contains("hybrid"), "{label}: {message}");
                assert!(!message.contains("Traceback"), "{label}: {message}");
                let result = l.result.as_ref().expect("driver result");
                assert!(result.xfers.is_empty(), "{label}");
                continue;
            }
        }
        check_against_reproduction(case, l);
        let disagreements = expected.compare(std::slice::from_ref(&l.report));
        assert!(disagreements.is_empty(), "{label}: {disagreements:?}");
        let result = l.result.as_ref().expect("driver result");
        match case.geometry_name() {
            "llama-gqa-prefix-cache" => {
                assert!(l.report.passed(), "{label}: {text}");
                assert!(
                    result
                        .xfers
                        .iter()
                        .all(|x| x.op == "WRITE" && x.agent.starts_with("prefill")),
                    "{label}: push posts prefill's WRITEs only"
                );
                let input = l.oracle_input.as_ref().expect("oracle input");
                let images = input.memory(Side::Decode, 0).expect("decode memory");
                let after: Vec<Vec<u8>> = images.after.iter().map(|a| a.to_vec()).collect();
                if images.before != after.into() {
                    moved += 1;
                }
                pinned += 1;
            }
            "deepseek-mla" => {
                // Every prefill rank writes the same replicated MLA pages:
                // the KV is right at twice the traffic, a cost and not a
                // violation, counted as the twin counts it.
                assert_eq!(*outcome, Outcome::Passed, "{label}: {text}");
                let rewrites = l.report.stats.redundant_writes;
                assert_eq!(rewrites.multiplicity, 2, "{label}: {rewrites:?}");
                let twin = run_case(case, &RunOptions::default());
                assert_eq!(rewrites, twin.stats.redundant_writes, "{label}");
                pinned += 1;
            }
            "gqa-kernel-ratio4" => {
                assert!(matches!(outcome, Outcome::Hung { .. }), "{label}: {text}");
                // Reported at once with what was pending, not waited out.
                assert!(text.contains("decode-0 still waits"), "{label}: {text}");
                assert!(text.contains("push_handshake_failed"), "{label}: {text}");
                assert!(!text.contains("did not complete within"), "{label}: {text}");
                pinned += 1;
            }
            "gqa-prefill-logical-larger" => {
                assert!(
                    matches!(
                        outcome,
                        Outcome::Crashed {
                            side: Side::Decode,
                            ..
                        }
                    ),
                    "{label}: {text}"
                );
                assert!(text.contains("IndexError"), "{label}: {text}");
                pinned += 1;
            }
            "mla-decode-logical-larger" if case.prompt_len == 3 => {
                assert!(
                    matches!(
                        outcome,
                        Outcome::Crashed {
                            side: Side::Prefill,
                            ..
                        }
                    ),
                    "{label}: {text}"
                );
                assert!(text.contains("AssertionError"), "{label}: {text}");
                pinned += 1;
            }
            "mla-decode-logical-larger" => {
                assert!(
                    matches!(
                        outcome,
                        Outcome::Crashed {
                            side: Side::Decode,
                            ..
                        }
                    ),
                    "{label}: {text}"
                );
                assert!(text.contains("IndexError"), "{label}: {text}");
                pinned += 1;
            }
            // Hybrid, equal kernels, different ppl: decode's completion
            // raises (push finding, 2).
            "g1-mla-kda-ppl3-vs-2" => {
                assert!(
                    matches!(
                        outcome,
                        Outcome::Crashed {
                            side: Side::Decode,
                            ..
                        }
                    ),
                    "{label}: {text}"
                );
                assert!(text.contains("IndexError"), "{label}: {text}");
                pinned += 1;
            }
            other => panic!("{label}: unexpected geometry {other}"),
        }
    }
    assert!(right >= 1 && pinned >= 6, "{pinned} pinned cases");
    assert!(
        moved >= 1,
        "vLLM's WRITEs changed decode's memory in {moved} cases"
    );
}

/// A push case whose thread never returns (a test hook blocks it inside the
/// case, vLLM's workers and writer threads alive) is reported hung at the
/// driver's time-out, and the driver starts afresh for the rest of the
/// batch: the cases after it get the same verdicts as alone.
#[test]
fn a_blocked_push_case_is_hung_and_does_not_poison_the_batch() {
    let Some(python) = interpreter("a_blocked_push_case_is_hung_and_does_not_poison_the_batch")
    else {
        return;
    };
    let mut all = cases_in("deepseek-mla.toml", &[65], Mode::Push);
    all.truncate(1);
    all.extend(
        cases_in("deepseek-mla.toml", &[65], Mode::Push)
            .into_iter()
            .take(1),
    );
    all.extend(
        cases_in("llama-gqa-prefix-cache.toml", &[37], Mode::Push)
            .into_iter()
            .take(1),
    );
    all.extend(cases("deepseek-mla.toml", &[65]).into_iter().take(1));
    let hooks = live::Hooks {
        block_cases: vec![0],
        ..live::Hooks::default()
    };
    let live =
        live::run_batch_hooked(&all, &python, Duration::from_secs(4), &hooks).expect("driver runs");
    assert_eq!(live.len(), all.len());
    let text = live[0].report.outcome.describe();
    assert!(
        matches!(live[0].report.outcome, Outcome::Hung { .. }),
        "{text}"
    );
    assert!(text.contains("did not complete within 4 s"), "{text}");
    assert!(text.contains("blocked at"), "{text}");
    assert!(!live[0].plan.equal, "a hung case's plan is not comparable");
    for (case, l) in all.iter().zip(&live).skip(1) {
        check_against_reproduction(case, l);
    }
}

/// A partly filled mamba group (`state_slots = 3` of 4 layer slots): vLLM's
/// own worker, built with mamba layers in the first three slots only, lists
/// state for those regions alone, exactly as kvgeom's connector does, in
/// both modes, and every oracle passes on its memory.
#[test]
fn vllm_lists_state_only_in_the_slots_holding_a_mamba_layer() {
    let Some(python) = interpreter("vllm_lists_state_only_in_the_slots_holding_a_mamba_layer")
    else {
        return;
    };
    let file = "gqa-mamba2-partly-filled-groups.toml";
    let mut all = cases_in(file, &[9], Mode::Pull);
    all.extend(cases_in(file, &[9], Mode::Push));
    assert_eq!(all[0].geometry.model.state_slot_count(), 3);
    let live = live::run_batch(&all, &python, Duration::from_secs(30)).expect("driver runs");
    for (case, l) in all.iter().zip(&live) {
        let label = label(case);
        assert!(l.plan.equal, "{label}: {:?}", l.plan.first_difference);
        assert!(
            l.report.passed(),
            "{label}: {}",
            l.report.outcome.describe()
        );
        // Region 3 (attention only) receives attention pairs, never state.
        let input = l.oracle_input.as_ref().expect("judged");
        let into_region_3: Vec<_> = input
            .pairs
            .iter()
            .filter(|p| p.destination.location.region == Some(3))
            .collect();
        assert!(!into_region_3.is_empty(), "{label}");
        assert!(
            into_region_3
                .iter()
                .all(|p| p.destination.location.attention().is_some()),
            "{label}: state pairs into region 3"
        );
    }
}

/// A geometry file that names DeepSeek-V3's HF config (attention only, so
/// vLLM's connector runs its cases), written where the tests keep scratch
/// files; `name` is the shipped derived pair's, so the pinned expectations
/// apply to it. Its engines run different backends, so, as the shipped pair
/// does, it turns the compatibility-hash check off: the blocks and bytes are
/// what these tests look at.
fn deepseek_v3_from_config(dir: &std::path::Path) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join("deepseek-v3-from-config.toml");
    let config =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/models/deepseek-v3.json");
    std::fs::write(
        &path,
        format!(
            "name = \"deepseek-v3-p8-flashmla-d4-flash-attn-mla-block-size-64\"\n\
             description = \"DeepSeek-V3 from its HF config: P TP8 FLASHMLA -> D TP4 FLASH_ATTN_MLA\"\n\
             enforce_handshake_compat = false\n\
             [model]\nhf_config = \"{}\"\nlayer_slots = 2\n\
             [prefill]\ntp_size = 8\nbackend = \"FLASHMLA\"\n\
             [decode]\ntp_size = 4\nbackend = \"FLASH_ATTN_MLA\"\nblock_size = 64\n",
            config.display()
        ),
    )
    .unwrap();
    path
}

/// Geometries that name their model config: vLLM's own block-size
/// derivation, run in the sweep's driver process on the same deployment,
/// chooses the blocks `kvgeom derive` gave (the shipped Qwen3-Next pair,
/// whose hybrid cases the driver itself refuses for now, and DeepSeek-V3,
/// whose cases run); a plain geometry has no `blocks`.
#[test]
fn vllm_chooses_the_blocks_kvgeom_derives_from_model_configs() {
    let test = "vllm_chooses_the_blocks_kvgeom_derives_from_model_configs";
    // The Qwen3-Next file is derived under 0.33.0's rules (its
    // model.vllm_release): 0.33.0's own derivation is compared with it.
    let Some(older) = interpreter_of(test, "0.33.0") else {
        return;
    };
    let older_python = older.python.to_string_lossy().to_string();
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("live-blocks-equal");
    let deepseek = deepseek_v3_from_config(&dir);
    let deepseek = deepseek.to_str().unwrap();
    // The pull case of each file at 65 tokens, by the interpreter `python`
    // names (`None`: the project's venv).
    let sweep = |python: Option<&str>, files: &[&str]| {
        let mut args = vec!["sweep", "--connector", "vllm"];
        if let Some(python) = python {
            args.extend(["--vllm-python", python]);
        }
        args.extend([
            "--mode",
            "pull",
            "--prompts",
            "65",
            "--alloc",
            "mainline",
            "--no-shrink",
            "--format",
            "json",
        ]);
        args.extend_from_slice(files);
        kvgeom(&args)
    };
    let qwen = "geometries/models/qwen3-next-p8-d2-flashinfer-from-config.toml";
    let out = sweep(
        Some(&older_python),
        &[qwen, deepseek, "geometries/deepseek-mla.toml"],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    // The block checks run before the cases in one process: Qwen3-Next's
    // case still gets the DS conv state layout the connector needs.
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(!err.contains("blocks vLLM derives differ"), "{err}");
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    let cases = doc["cases"].as_array().expect("cases");
    assert_eq!(cases.len(), 3);
    let engine = |b: &serde_json::Value, side: &str| {
        (
            b["vllm"][side]["logical_block"].as_u64(),
            b["vllm"][side]["kernel_block"].as_u64(),
            b["vllm"][side]["page_bytes"].as_u64(),
        )
    };
    for c in cases {
        let name = c["geometry"].as_str().unwrap_or_default();
        let blocks = &c["blocks"];
        match name {
            "qwen3-next-p8-d2-flashinfer-from-config" => {
                assert_eq!(blocks["equal"], true, "{blocks}");
                assert!(blocks["first_difference"].is_null(), "{blocks}");
                assert_eq!(
                    engine(blocks, "prefill"),
                    (Some(144), Some(16), Some(147456))
                );
                assert_eq!(
                    engine(blocks, "decode"),
                    (Some(544), Some(32), Some(557056))
                );
                assert_eq!(blocks["vllm"], blocks["kvgeom"]);
                assert_eq!(c["passed"], true, "{c}");
                assert_eq!(c["plan"]["equal"], true, "{c}");
            }
            // Derived under the pinned release's rules: checked below.
            "deepseek-v3-p8-flashmla-d4-flash-attn-mla-block-size-64" => {
                assert!(blocks.is_null(), "{c}");
                assert_eq!(c["passed"], true, "{c}");
            }
            "deepseek-mla" => assert!(blocks.is_null(), "{c}"),
            other => panic!("unexpected geometry {other}"),
        }
    }

    // On the pinned 0.34.0 the DeepSeek-V3 file's blocks are compared with
    // its own derivation; it would derive other blocks for the Qwen3-Next
    // deployment (its default block is 64): that check is left out, with a
    // note, and the case still runs.
    if interpreter(test).is_none() {
        return;
    }
    let out = sweep(None, &[qwen, deepseek]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        err.contains(
            "qwen3-next-p8-d2-flashinfer-from-config.toml: its blocks are derived under vLLM 0.33.0's rules (model.vllm_release), so vLLM 0.34.0's own derivation is not compared with them"
        ),
        "{err}"
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    let cases = doc["cases"].as_array().expect("cases");
    assert_eq!(cases.len(), 2);
    let qwen = &cases[0];
    assert!(qwen["blocks"].is_null(), "{qwen}");
    assert_eq!(qwen["passed"], true, "{qwen}");
    let deepseek = &cases[1];
    let blocks = &deepseek["blocks"];
    assert_eq!(blocks["equal"], true, "{blocks}");
    assert_eq!(engine(blocks, "prefill"), (Some(64), Some(64), Some(73728)));
    assert_eq!(engine(blocks, "decode"), (Some(64), Some(64), Some(73728)));
    assert_eq!(deepseek["passed"], true, "{deepseek}");
    assert_eq!(deepseek["plan"]["equal"], true, "{deepseek}");
}

/// Another vLLM (played by the pinned one with a `sitecustomize` that
/// halves the kernel block its real attention backends select) disagrees
/// with kvgeom's derivation: the sweep lists the difference like a plan
/// difference and exits 1 although every case passes, and `explain` prints
/// it and exits 1.
#[test]
fn blocks_that_differ_from_vllms_are_reported_and_exit_1() {
    let Some(python) = interpreter("blocks_that_differ_from_vllms_are_reported_and_exit_1") else {
        return;
    };
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("live-blocks-differ");
    let deepseek = deepseek_v3_from_config(&dir);
    let site = dir.join("site");
    std::fs::create_dir_all(&site).unwrap();
    std::fs::write(
        site.join("sitecustomize.py"),
        r#"import importlib.abc
import importlib.util
import sys


class Halve(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "vllm.v1.worker.utils":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            select = module.select_common_block_size

            def halved(block, backends, *args, **kwargs):
                chosen = select(block, backends, *args, **kwargs)
                real = all(getattr(b, "__module__", "").startswith("vllm.") for b in backends)
                return chosen // 2 if real else chosen

            module.select_common_block_size = halved

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, Halve())
"#,
    )
    .unwrap();
    let wrapper = python_with_site(&dir, &site, &python.python.to_string_lossy());
    let out = kvgeom(&[
        "sweep",
        "--connector",
        "vllm",
        "--vllm-python",
        wrapper.to_str().unwrap(),
        "--mode",
        "pull",
        "--prompts",
        "65",
        "--no-shrink",
        deepseek.to_str().unwrap(),
    ]);
    let (stdout, err) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(1), "{stdout}{err}");
    assert!(stdout.contains("1 passed, 0 failed"), "{stdout}");
    assert!(
        stdout.contains(
            "blocks of deepseek-v3-p8-flashmla-d4-flash-attn-mla-block-size-64 vs vLLM's derivation: \
             differ: prefill kernel_block: kvgeom 64, vLLM 32"
        ),
        "{stdout}"
    );
    assert!(
        err.contains(
            "1 geometries: the blocks vLLM derives differ from kvgeom's derivation\n\
             - deepseek-v3-p8-flashmla-d4-flash-attn-mla-block-size-64: prefill kernel_block: kvgeom 64, vLLM 32"
        ),
        "{err}"
    );
    assert!(
        !err.contains("disagreements with the expectations"),
        "{err}"
    );
    assert!(!err.contains("differ from kvgeom's --policy"), "{err}");
    let explain = kvgeom(&[
        "explain",
        deepseek.to_str().unwrap(),
        "--prompt",
        "65",
        "--connector",
        "vllm",
        "--vllm-python",
        wrapper.to_str().unwrap(),
    ]);
    let text = String::from_utf8_lossy(&explain.stdout);
    assert_eq!(explain.status.code(), Some(1), "{text}");
    assert!(text.contains("outcome: passed"), "{text}");
    assert!(
        text.contains("deepseek-v3.json: differ: prefill kernel_block: kvgeom 64, vLLM 32"),
        "{text}"
    );
}

/// A vLLM other than the pinned one (the pinned wheel, reporting another
/// version, as a branch would): the expectations do not apply, each case's
/// transfers are compared with both of kvgeom's policies, and the exit
/// status is a plain sweep's (1 on a violation, plan differences are
/// information).
#[test]
fn another_vllm_is_compared_with_each_policy() {
    // 0.33.0's code reporting a dev build of the next release: compared
    // with the newest modelled release before it, 0.33.0.
    let Some(python) = interpreter_of("another_vllm_is_compared_with_each_policy", "0.33.0") else {
        return;
    };
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("other-vllm");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("sitecustomize.py"),
        "import importlib.metadata as _m\n\
         _version = _m.version\n\
         _m.version = lambda name: '0.33.1.dev0+branch' if name == 'vllm' else _version(name)\n",
    )
    .unwrap();
    // The venv's own path (a symlink resolved would leave the venv).
    let venv_python = std::path::absolute(&python.python).unwrap();
    let wrapper = python_with_site(&dir, &dir, &venv_python.to_string_lossy());
    let sweep_in =
        |mode: &str, file: &str, prompt: &str| -> (Option<i32>, serde_json::Value, String) {
            let out = kvgeom(&[
                "sweep",
                "--connector",
                "vllm",
                "--vllm-python",
                wrapper.to_str().unwrap(),
                "--mode",
                mode,
                "--alloc",
                "mainline",
                "--prompts",
                prompt,
                "--no-shrink",
                "--format",
                "json",
                file,
            ]);
            let err = String::from_utf8_lossy(&out.stderr).to_string();
            let report =
                serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {err}"));
            (out.status.code(), report, err)
        };
    let sweep = |file: &str, prompt: &str| sweep_in("pull", file, prompt);
    // 0.33.0's dead-block pairing: vLLM's plan is the vllm-0.33.0 policy's,
    // not kvgeom's; the violation makes it exit 1.
    let (code, report, err) = sweep("geometries/gqa-prefill-logical-larger.toml", "5");
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains(
            "vLLM 0.33.1.dev0+branch is not a release kvgeom models: the expectations do not apply; its plans are compared with --policy vllm-0.33.0"
        ),
        "{err}"
    );
    let case = &report["cases"][0];
    assert_eq!(case["plan"]["equal"], true, "{case}");
    assert_eq!(case["plan_kvgeom"]["equal"], false, "{case}");
    assert!(
        err.contains("vLLM's transfers differ from kvgeom's --policy kvgeom plan (information: not a release kvgeom models)"),
        "{err}"
    );
    // Where both policies agree and vLLM is right: equal to both, exit 0.
    let (code, report, err) = sweep("geometries/deepseek-mla.toml", "65");
    assert_eq!(code, Some(0), "{err}");
    let case = &report["cases"][0];
    assert_eq!(
        (
            case["plan"]["equal"].clone(),
            case["plan_kvgeom"]["equal"].clone()
        ),
        (true.into(), true.into()),
        "{case}"
    );
    // Push with equal ppl: the same pairs, but kvgeom's decode runs the
    // receive post-process on the counts prefill reports (nothing to zero
    // here) where 0.33.0's push reports none and calls none.
    let (_, report, err) = sweep_in(
        "push",
        "geometries/mla-kda-equal-ppl-prefix-cache.toml",
        "13",
    );
    let case = &report["cases"][0];
    assert_eq!(case["plan"]["equal"], true, "{case} {err}");
    assert_eq!(case["plan_kvgeom"]["equal"], false, "{case}");
    let difference = case["plan_kvgeom"]["first_difference"]
        .as_str()
        .unwrap_or_default();
    assert!(
        difference.starts_with("post-process: kvgeom calls it"),
        "{case}"
    );
}

/// Real NIXL agents in the driver (`--nixl real`): pull and push on an
/// attention-only geometry (MLA, P TP2 -> D TP1) and a hybrid (MLA + KDA,
/// different ppl on P and D, whose split lists vLLM prepares as VRAM on the
/// faked CUDA platform). Every case must give the stand-in's verdict,
/// violated oracles, plan and final memory, and the expectations' verdict;
/// every list keeps the memory type vLLM asked for. Skipped when the venv
/// or the `nixl` package is missing (`scripts/install-vllm.sh --nixl`).
#[test]
fn real_nixl_gives_the_stand_ins_verdicts_plans_and_memory() {
    let test = "real_nixl_gives_the_stand_ins_verdicts_plans_and_memory";
    let Some(python) = interpreter(test) else {
        return;
    };
    let driver = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("vllm-driver");
    let real = match kvgeom::driver::resolve(
        &live::VLLM_DRIVER,
        &python.python,
        &driver,
        kvgeom::driver::NixlChoice::Real,
    ) {
        Ok(r) => r.run,
        Err(why) => {
            skip(test, format_args!("no real NIXL ({why})"));
            return;
        }
    };
    assert!(
        matches!(real, kvgeom::driver::NixlRun::Real { .. }),
        "{real:?}"
    );
    let mut all = Vec::new();
    for mode in [Mode::Pull, Mode::Push] {
        all.extend(cases_in("deepseek-mla.toml", &[17, 65], mode));
        all.extend(cases_in("g1-mla-kda-ppl3-vs-2.toml", &[17, 33], mode));
    }
    let limit = Duration::from_secs(30);
    let stand_in = live::run_batch(&all, &python, limit).expect("driver runs (stand-in)");
    let real_python = Interpreter {
        nixl: real,
        ..python.clone()
    };
    let real_live = live::run_batch(&all, &real_python, limit).expect("driver runs (real NIXL)");
    assert_eq!((stand_in.len(), real_live.len()), (all.len(), all.len()));
    let expected = expectations(&python.vllm_version);
    let mut vram_lists = 0;
    let mut compared_memory = 0;
    for ((case, s), r) in all.iter().zip(&stand_in).zip(&real_live) {
        let label = label(case);
        check_against_reproduction(case, r);
        assert_eq!(
            (kind(&r.report.outcome), r.plan.clone()),
            (kind(&s.report.outcome), s.plan.clone()),
            "{label}: real NIXL {} / stand-in {}",
            r.report.outcome.describe(),
            s.report.outcome.describe()
        );
        let oracles = |l: &LiveReport| {
            let mut o: Vec<_> = l.report.violations.iter().map(|v| v.oracle).collect();
            o.sort();
            o.dedup();
            o
        };
        assert_eq!(oracles(r), oracles(s), "{label}");
        let (rr, sr) = (
            r.result.as_ref().expect("a result"),
            s.result.as_ref().expect("a result"),
        );
        assert_eq!(rr.nixl.as_deref(), Some("real"), "{label}");
        assert_eq!(sr.nixl.as_deref(), Some("stand-in"), "{label}");
        let mems = |res: &kvgeom::internals::live::CaseResult| -> Vec<(String, String, String)> {
            let mut m: Vec<_> = res
                .dlists
                .iter()
                .map(|d| (d.agent.clone(), d.target.clone(), d.mem.clone()))
                .collect();
            m.sort();
            m
        };
        assert_eq!(mems(rr), mems(sr), "{label}: the lists' memory types");
        vram_lists += rr.dlists.iter().filter(|d| d.mem == "VRAM").count();
        if let (Some(ri), Some(si)) = (&r.oracle_input, &s.oracle_input) {
            for side in [Side::Prefill, Side::Decode] {
                let engine = match side {
                    Side::Prefill => &case.geometry.prefill,
                    Side::Decode => &case.geometry.decode,
                };
                for rank in 0..engine.tp_size {
                    let (a, b) = (ri.memory(side, rank), si.memory(side, rank));
                    let after = |m: Option<&oracle::MemoryImages>| {
                        m.map(|m| m.after.iter().map(|a| a.to_vec()).collect::<Vec<_>>())
                    };
                    assert_eq!(
                        after(a),
                        after(b),
                        "{label}: {side:?} rank {rank}'s final memory"
                    );
                }
            }
            compared_memory += 1;
        }
        let listed = expected.failures.iter().any(|f| f.covers(case));
        assert_eq!(
            !r.report.passed(),
            listed,
            "{label}: {} (listed in the expectations: {listed})",
            r.report.outcome.describe()
        );
    }
    assert!(
        vram_lists > 0,
        "no list was prepared as VRAM: the relabelling went untested"
    );
    assert!(
        compared_memory >= 4,
        "only {compared_memory} cases returned final memory to compare"
    );
}

/// `--nixl real` with an interpreter whose `nixl` does not load is exit 2
/// naming what to install, before any case runs; `--nixl auto` then falls
/// back to the stand-in and says why; `--nixl` with kvgeom's own connector
/// is refused.
#[test]
fn nixl_real_without_the_package_names_what_to_install() {
    let Some(python3) = ["python3", "python"].into_iter().find(|p| {
        Command::new(p)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    }) else {
        skip(
            "nixl_real_without_the_package_names_what_to_install",
            "no python3",
        );
        return;
    };
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("python-without-nixl");
    std::fs::create_dir_all(&dir).unwrap();
    // Answers the interpreter probe (vllm-driver/provenance.py) as an
    // unmodified vLLM 0.33.0 venv; runs the driver's NIXL probe on a Python
    // where no `nixl` can be found.
    let wrapper = dir.join("python");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\ncase \"$1\" in *provenance.py) \
             echo '{{\"version\": \"0.33.0\", \"modified_files\": [], \"source\": null}}'; exit 0;; esac\n\
             unset PYTHONPATH\nexec {python3} -S \"$@\"\n"
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let run = |nixl: &str| {
        kvgeom(&[
            "sweep",
            "--connector",
            "vllm",
            "--vllm-python",
            wrapper.to_str().unwrap(),
            "--nixl",
            nixl,
            "--mode",
            "pull",
            "--prompts",
            "3",
            "geometries/deepseek-mla.toml",
        ])
    };
    let out = run("real");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    for needed in [
        "error: --nixl real: ",
        "the nixl package does not load (ModuleNotFoundError: No module named 'nixl')",
        "scripts/install-vllm.sh --nixl",
        "nixl==1.5.1 and nixl-cu13==1.5.1",
    ] {
        assert!(err.contains(needed), "{needed:?} not in: {err}");
    }
    assert!(!err.contains("cases in"), "a case ran: {err}");
    // auto: the probe fails the same way, the stand-in is chosen (the
    // wrapper has no vLLM, so the driver itself then fails: exit 2).
    let out = run("auto");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "note: --nixl auto: real NIXL does not run here (the nixl package does not load"
        ),
        "{err}"
    );
    assert!(
        err.contains("the driver's stand-in moves the bytes"),
        "{err}"
    );
    let out = kvgeom(&["sweep", "--nixl", "real", "geometries/deepseek-mla.toml"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--nixl selects what moves the bytes of vLLM's connector"),
        "{err}"
    );
}

/// What the driver touches on vLLM by name, from its sources: every
/// `receiver._name` (receivers that are the driver's own objects, the
/// standard library's or NIXL's left out), every `"_name"` string (methods
/// patched by name, attributes read with `getattr`), and every global it
/// assigns in vLLM's modules (`base_worker.NAME = ...`, `_torch_utils.NAME
/// = ...`). Comments are skipped.
fn driver_names(sources: &[(String, String)]) -> Vec<(String, String)> {
    // The driver's own modules (api_check, compat) are not vLLM's.
    const NOT_VLLM: [&str; 8] = [
        "self",
        "cls",
        "sys",
        "nixl",
        "executor",
        "os",
        "api_check",
        "compat",
    ];
    const VLLM_MODULES: [&str; 2] = ["base_worker", "_torch_utils"];
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut out: Vec<(String, String)> = Vec::new();
    let mut add = |file: &str, name: &str| {
        if !out.iter().any(|(_, n)| n == name) {
            out.push((file.to_string(), name.to_string()));
        }
    };
    for (file, text) in sources {
        for line in text.lines() {
            let code = match line.find('#') {
                Some(i) if !line[..i].contains('"') => &line[..i],
                _ => line,
            };
            let chars: Vec<char> = code.chars().collect();
            let word_at = |start: usize| -> String {
                chars[start..].iter().take_while(|c| ident(**c)).collect()
            };
            for (i, c) in chars.iter().enumerate() {
                if *c == '.' && i > 0 && ident(chars[i - 1]) {
                    let mut s = i;
                    while s > 0 && ident(chars[s - 1]) {
                        s -= 1;
                    }
                    let receiver: String = chars[s..i].iter().collect();
                    let name = word_at(i + 1);
                    let rest: String = chars[i + 1 + name.len()..].iter().collect();
                    let rest = rest.trim_start();
                    let assigned = rest.starts_with('=') && !rest.starts_with("==");
                    let patched_global =
                        VLLM_MODULES.contains(&receiver.as_str()) && assigned && !name.is_empty();
                    let private = name.starts_with('_')
                        && !name.starts_with("__")
                        && !NOT_VLLM.contains(&receiver.as_str())
                        && !receiver.starts_with(char::is_numeric);
                    if patched_global || private {
                        add(file, &name);
                    }
                }
                if *c == '"' && chars.get(i + 1) == Some(&'_') {
                    let name = word_at(i + 1);
                    // "_worker": the standard library's executor thread function.
                    if !name.starts_with("__")
                        && name != "_worker"
                        && chars.get(i + 1 + name.len()) == Some(&'"')
                    {
                        add(file, &name);
                    }
                }
            }
        }
    }
    out
}

/// The names of `driver_names` that `api_check` (the text of
/// vllm-driver/api_check.py) does not list as a quoted string.
fn unchecked(sources: &[(String, String)], api_check: &str) -> Vec<String> {
    driver_names(sources)
        .into_iter()
        .filter(|(_, name)| {
            !api_check.contains(&format!("\"{name}\""))
                && !api_check.contains(&format!(".{name}\""))
        })
        .map(|(file, name)| format!("{file}: {name}"))
        .collect()
}

/// Every private attribute and patched global of vLLM the driver touches is
/// in vllm-driver/api_check.py, so that another vLLM without it is refused
/// with its name instead of failing in a case. Python-free: it reads the
/// driver's files. It fails on a copy of the check with one name taken out.
#[test]
fn api_check_lists_every_private_name_the_driver_touches() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("vllm-driver");
    let mut sources = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if name.ends_with(".py") && name != "api_check.py" {
            sources.push((name, std::fs::read_to_string(&path).unwrap()));
        }
    }
    sources.sort();
    let check = std::fs::read_to_string(dir.join("api_check.py")).unwrap();
    let names: Vec<String> = driver_names(&sources).into_iter().map(|(_, n)| n).collect();
    // The scan finds what it is for: attributes, patched methods, globals.
    for expected in [
        "_recving_transfers",
        "_zero_region_blocks",
        "_send_registration_to_p",
        "_has_mamba",
        "check_nixl_version",
        "get_current_attn_backends",
        "zmq_ctx",
        "PIN_MEMORY",
    ] {
        assert!(
            names.iter().any(|n| n == expected),
            "{expected} not found by the scan: {names:?}"
        );
    }
    for own in ["_current_frames", "_api", "_threads", "_add", "_TP"] {
        assert!(
            !names.iter().any(|n| n == own),
            "{own} is not vLLM's: {names:?}"
        );
    }
    let missing = unchecked(&sources, &check);
    assert!(
        missing.is_empty(),
        "vllm-driver/api_check.py does not check: {missing:?}"
    );
    for name in ["_recving_transfers", "_log_failure", "zmq_ctx"] {
        let without = check
            .replace(&format!("\"{name}\""), "\"removed\"")
            .replace(&format!(".{name}\""), ".removed\"");
        let found = unchecked(&sources, &without);
        assert!(
            found.iter().any(|f| f.ends_with(&format!(": {name}"))),
            "a check without {name} passes: {found:?}"
        );
    }
}

/// `scripts/install-vllm.sh --version/--source` refuse bad input with exit 2
/// and the reason, before any download: a directory that is not there or is
/// no vLLM tree, a version that is no release number, `--venv` alone, and
/// `.vllm-venv/` as the target. Needs bash only.
#[test]
fn install_script_refuses_bad_input_with_exit_2() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let empty = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("not-a-vllm-tree");
    std::fs::create_dir_all(&empty).unwrap();
    let empty = empty.to_str().unwrap().to_string();
    let pinned = root.join(".vllm-venv");
    let pinned = pinned.to_str().unwrap().to_string();
    for (args, reason) in [
        (vec!["--source", "/nonexistent/vllm"], "no such directory"),
        (vec!["--source", empty.as_str()], "not a vLLM source tree"),
        (vec!["--version", "latest;rm"], "not a release number"),
        (vec!["--version"], "--version needs a value"),
        (
            vec!["--venv", "/tmp/x"],
            "--venv goes with --version or --source",
        ),
        (
            vec!["--version", "0.31.0", "--source", "."],
            "exclude each other",
        ),
        (
            vec!["--version", "0.31.0", "--venv", pinned.as_str()],
            "holds the pinned vLLM",
        ),
        (vec!["--bogus"], "unknown option --bogus"),
    ] {
        let out = Command::new("bash")
            .arg(root.join("scripts/install-vllm.sh"))
            .args(&args)
            .output()
            .expect("run bash");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(reason), "{args:?}: {reason:?} not in {err}");
        assert!(!err.contains("Traceback"), "{args:?}: {err}");
    }
}

/// scripts/vllm-wheel-deps.py sorts a wheel's Requires-Dist: torch on its
/// own, GPU-only packages and other platforms' and extras' requirements left
/// out, flashinfer without its dependencies, the light ones kept with their
/// extras. A made-up wheel plays the vllm wheel; needs a python3.
#[test]
fn wheel_dependencies_are_filtered_to_what_cpu_import_needs() {
    let Some(python3) = ["python3", "python"].into_iter().find(|p| {
        Command::new(p)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    }) else {
        skip(
            "wheel_dependencies_are_filtered_to_what_cpu_import_needs",
            "no python3",
        );
        return;
    };
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("wheel-deps");
    std::fs::create_dir_all(&dir).unwrap();
    let wheel = dir.join("vllm-9.9.9-py3-none-any.whl");
    let metadata = "Metadata-Version: 2.1\\nName: vllm\\nVersion: 9.9.9\\n\
        Requires-Dist: torch==2.13.0\\nRequires-Dist: numpy\\n\
        Requires-Dist: fastapi[standard]<0.137.0,>=0.133.0\\n\
        Requires-Dist: nvidia-cutlass-dsl[cu13]==4.7.1\\nRequires-Dist: torchvision==0.28.0\\n\
        Requires-Dist: xformers; platform_system == \\\"Linux\\\"\\nRequires-Dist: ray>=2\\n\
        Requires-Dist: flashinfer-python==0.7.0.post1\\n\
        Requires-Dist: pywin32; sys_platform == \\\"win32\\\"\\nRequires-Dist: pandas; extra == \\\"bench\\\"\\n";
    let make = format!(
        "import zipfile; z = zipfile.ZipFile('{}', 'w'); z.writestr('vllm-9.9.9.dist-info/METADATA', \"{metadata}\"); z.close()",
        wheel.display()
    );
    let made = Command::new(python3).args(["-c", &make]).output().unwrap();
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(python3)
        .arg(root.join("scripts/vllm-wheel-deps.py"))
        .arg(&wheel)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let plan: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(
        plan,
        [
            "torch torch==2.13.0",
            "dep numpy",
            "dep fastapi[standard]<0.137.0,>=0.133.0",
            "nodeps flashinfer-python==0.7.0.post1",
            "dep pytest",
            "dep loguru",
            "dep nvidia-ml-py",
        ]
    );
    let skipped = String::from_utf8_lossy(&out.stderr);
    for name in ["nvidia-cutlass-dsl", "torchvision", "xformers", "ray"] {
        assert!(
            skipped.contains(&format!("skip {name}")),
            "{name}: {skipped}"
        );
    }
    assert!(
        !skipped.contains("pandas") && !skipped.contains("pywin32"),
        "{skipped}"
    );
}

#[test]
fn an_exception_in_the_drivers_own_code_is_a_harness_error_not_a_crash_of_vllm() {
    let test = "an_exception_in_the_drivers_own_code_is_a_harness_error_not_a_crash_of_vllm";
    if interpreter(test).is_none() {
        return;
    }
    // gqa-kernel-ratio4: decode's kernel block is 4x prefill's, so vLLM
    // calls its receive post-process, which the driver wraps to record it;
    // the test hook makes that wrapper (driver code, called by vLLM's
    // get_finished) raise.
    let args = [
        "sweep",
        "--connector",
        "vllm",
        "--requests",
        "direct",
        "--mode",
        "pull",
        "--alloc",
        "mainline",
        "--prompts",
        "5",
        "--no-shrink",
        "--format",
        "json",
        "geometries/gqa-kernel-ratio4.toml",
    ];
    let faulty = kvgeom_with_env(&args, &[("KVGEOM_DRIVER_TEST_FAULT", "post-process")]);
    let report: serde_json::Value = serde_json::from_slice(&faulty.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", crate::support::text(&faulty)));
    assert_eq!(
        faulty.status.code(),
        Some(2),
        "a harness error is exit 2: {}",
        crate::support::text(&faulty)
    );
    assert!(crate::support::text(&faulty).contains("harness errors"));
    let cases = report["cases"].as_array().expect("cases");
    assert!(!cases.is_empty(), "{report}");
    for case in cases {
        let outcome = &case["outcome"];
        assert_eq!(
            outcome["kind"], "error",
            "a driver fault judged as vLLM's: {outcome}"
        );
        let message = outcome["message"].as_str().unwrap_or_default();
        for part in [
            "harness error in the driver",
            "vllm-driver/live_case.py:",
            "KVGEOM_DRIVER_TEST_FAULT",
            "vLLM 0.",
            "vLLM frame: ",
        ] {
            assert!(message.contains(part), "{part:?} not in {message}");
        }
    }
    // Without the fault the same cases are judged (the fault made the error).
    let healthy = kvgeom(&args);
    let report: serde_json::Value = serde_json::from_slice(&healthy.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", crate::support::text(&healthy)));
    assert_ne!(
        healthy.status.code(),
        Some(2),
        "{}",
        crate::support::text(&healthy)
    );
    for case in report["cases"].as_array().expect("cases") {
        assert_ne!(case["outcome"]["kind"], "error", "{case}");
    }
}

#[test]
fn a_release_whose_canary_fails_is_not_run_and_nothing_is_judged() {
    let test = "a_release_whose_canary_fails_is_not_run_and_nothing_is_judged";
    if interpreter(test).is_none() {
        return;
    }
    let args = [
        "sweep",
        "--connector",
        "vllm",
        "--requests",
        "direct",
        "--mode",
        "pull",
        "--prompts",
        "5",
        "--no-shrink",
        "--format",
        "json",
        "geometries/llama-gqa-prefix-cache.toml",
    ];
    // Every direct pull case, the canary first, fails inside the driver.
    let out = kvgeom_with_env(&args, &[("KVGEOM_DRIVER_TEST_FAULT", "every-pull-case")]);
    let text = crate::support::text(&out);
    assert_eq!(out.status.code(), Some(2), "{text}");
    assert!(
        text.contains("not run: the canary case (kvgeom-canary-gqa-equal-blocks, N=20, pull) did not pass: harness error"),
        "{text}"
    );
    assert!(
        out.stdout.is_empty(),
        "no report of a release that is not run: {text}"
    );
}
