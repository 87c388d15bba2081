//! The `kvgeom` binary: exit statuses (0 pass, 1 violated, 2 bad input),
//! report formats and the replay command of a failure.

use std::path::{Path, PathBuf};
use std::process::Output;

use crate::support::{kvgeom, text};

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kvgeom-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

#[test]
fn a_passing_sweep_exits_0_and_writes_the_json_report() {
    let out = tmp("g1.json");
    let o = kvgeom(&[
        "sweep",
        "geometries/g1-mla-kda-ppl3-vs-2.toml",
        "--prompts",
        "2..=6,25",
        "--format",
        "json",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    // 6 prompt lengths x 2 modes x 2 allocations.
    assert_eq!(report["summary"]["cases"], 24);
    assert_eq!(report["summary"]["passed"], 24);
    assert_eq!(report["summary"]["failed"], 0);
    let case = &report["cases"][0];
    for key in [
        "geometry",
        "prompt_len",
        "prefix_hit",
        "mode",
        "passed",
        "stats",
        "violations",
    ] {
        assert!(case.get(key).is_some(), "missing {key} in {case}");
    }
    assert!(case["stats"]["pairs"].as_u64().unwrap() > 0);
    assert!(case["stats"]["transferred_bytes"].as_u64().unwrap() > 0);
    // What ran: kvgeom's connector at the crate's version, on each case and
    // on the report; `connector` and `policy` keep their meaning.
    let kvgeom_code = serde_json::json!({
        "connector": "kvgeom",
        "version": env!("CARGO_PKG_VERSION"),
        "policy": "kvgeom",
        "source": null,
    });
    assert_eq!(report["code_under_test"], kvgeom_code, "{report}");
    for case in report["cases"].as_array().unwrap() {
        assert_eq!(case["code_under_test"], kvgeom_code, "{case}");
        assert_eq!(case["policy"], "kvgeom");
    }
}

#[test]
fn the_code_under_test_names_the_variant_that_ran() {
    for (args, policy) in [
        (&["--policy", "vllm-0.33.0"][..], "vllm-0.33.0"),
        (
            &["--defect", "end-trim-alignment"][..],
            "defect end-trim-alignment",
        ),
    ] {
        let mut all = vec![
            "sweep",
            "geometries/g1-mla-kda-ppl3-vs-2.toml",
            "--prompts",
            "25",
            "--mode",
            "pull",
            "--no-shrink",
            "--format",
            "json",
        ];
        all.extend_from_slice(args);
        let o = kvgeom(&all);
        let report: serde_json::Value =
            serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&o)));
        assert_eq!(report["code_under_test"]["policy"], policy, "{args:?}");
        assert_eq!(report["cases"][0]["code_under_test"]["policy"], policy);
        assert_eq!(report["cases"][0]["code_under_test"]["connector"], "kvgeom");
    }
}

#[test]
fn a_defect_exits_1_with_a_minimal_replay_command() {
    let o = kvgeom(&[
        "sweep",
        "geometries/g1-mla-kda-ppl3-vs-2.toml",
        "--mode",
        "pull",
        "--prompts",
        "20..=26",
        "--defect",
        "no-clipped-block-zeroing",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let t = text(&o);
    // Shrunk to the smallest failing prompt length of the range's geometry.
    assert!(
        t.contains("replay: kvgeom explain geometries/g1-mla-kda-ppl3-vs-2.toml --prompt"),
        "{t}"
    );
    assert!(t.contains("--defect no-clipped-block-zeroing"), "{t}");
    assert!(t.contains("[transferred_or_zeroed]"), "{t}");
}

/// The replay command of a failure names its geometry file quoted for a
/// shell when its path has a space, and the printed line runs as pasted.
#[test]
fn a_replay_command_names_a_path_with_spaces_so_that_it_runs_as_printed() {
    let dir = crate::support::scratch(module_path!(), "with space");
    let file = dir.join("g1-copy.toml");
    std::fs::copy("geometries/g1-mla-kda-ppl3-vs-2.toml", &file).expect("copy");
    let o = kvgeom(&[
        "sweep",
        file.to_str().expect("UTF-8"),
        "--mode",
        "pull",
        "--prompts",
        "20..=26",
        "--defect",
        "no-clipped-block-zeroing",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let t = text(&o);
    let line = t
        .lines()
        .find_map(|l| l.trim().strip_prefix("replay: kvgeom "))
        .unwrap_or_else(|| panic!("no replay line: {t}"));
    assert!(line.contains(&format!("'{}'", file.display())), "{line}");
    let pasted = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("\"$0\" {line}"))
        .arg(env!("CARGO_BIN_EXE_kvgeom"))
        .current_dir(crate::support::root())
        .output()
        .expect("sh runs");
    assert_eq!(pasted.status.code(), Some(1), "{}", text(&pasted));
    assert!(
        text(&pasted).contains("transferred_or_zeroed"),
        "{}",
        text(&pasted)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn junit_output_has_a_failure_per_failing_case() {
    let out = tmp("g5.xml");
    let o = kvgeom(&[
        "sweep",
        "geometries/g5-mla-kda-mixed-kernel.toml",
        "--mode",
        "pull",
        "--alloc",
        "with-last-token",
        "--defect",
        "two-path-zeroing",
        "--format",
        "junit",
        "--out",
        out.to_str().unwrap(),
        "--no-shrink",
    ]);
    assert_eq!(o.status.code(), Some(1));
    let xml = std::fs::read_to_string(&out).unwrap();
    assert!(
        xml.contains("<testsuites name=\"kvgeom\" tests=\"16\" failures=\"11\">"),
        "{xml}"
    );
    assert_eq!(xml.matches("<failure ").count(), 11);
    for property in [
        "<property name=\"kvgeom.code_under_test.connector\" value=\"kvgeom\"/>".to_string(),
        format!(
            "<property name=\"kvgeom.code_under_test.version\" value=\"{}\"/>",
            env!("CARGO_PKG_VERSION")
        ),
        "<property name=\"kvgeom.code_under_test.policy\" value=\"defect two-path-zeroing\"/>"
            .to_string(),
    ] {
        assert!(xml.contains(&property), "no `{property}` in {xml}");
    }
}

#[test]
fn bad_input_exits_2_with_the_file_field_and_rule() {
    let bad = tmp("bad.toml");
    std::fs::write(
        &bad,
        "description = \"x\"\n[model]\nlayer_slots = 1\ngroups = [\"attention\"]\n[model.attention]\nkind = \"mla\"\nhead_size = 8\ndtype_bytes = 2\n[prefill]\ntp_size = 1\nkernel_block = 6\nlogical_block = 16\n[decode]\ntp_size = 1\nkernel_block = 4\nlogical_block = 16\n",
    )
    .unwrap();
    let o = kvgeom(&["sweep", bad.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    let t = text(&o);
    assert!(t.contains("bad.toml"), "{t}");
    assert!(t.contains("prefill.kernel_block"), "{t}");
    assert!(
        t.contains("kernel block 6 does not divide logical block 16"),
        "{t}"
    );
    for args in [
        vec!["sweep", "no/such/dir"],
        vec!["sweep", "geometries", "--prompts", "9..=2"],
        vec!["sweep", "geometries", "--defect", "no-such-bug"],
        vec!["explain", "geometries/deepseek-mla.toml", "--prompt", "0"],
        vec!["diff-trace", "Cargo.toml"],
    ] {
        let o = kvgeom(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
    }
}

#[test]
fn vram_without_the_cuda_feature_is_bad_input() {
    let o = kvgeom(&["sweep", "geometries/deepseek-mla.toml", "--memory", "vram"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("cuda"));
}

#[test]
fn explain_shows_stale_bytes_per_block_for_two_path_zeroing() {
    let svg = tmp("g5.svg");
    let o = kvgeom(&[
        "explain",
        "geometries/g5-mla-kda-mixed-kernel.toml",
        "--prompt",
        "29",
        "--alloc",
        "with-last-token",
        "--defect",
        "two-path-zeroing",
        "--svg",
        svg.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let t = text(&o);
    // 192 stale bytes (two 96-byte kernel pages) in each region's last logical block.
    let stale: Vec<&str> = t
        .lines()
        .filter(|l| l.ends_with("<- stale/wrong bytes"))
        .collect();
    assert_eq!(stale.len(), 2, "{t}");
    for line in stale {
        let cols: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(&cols[4..8], &["96", "0", "192", "0"], "{line}");
    }
    assert!(std::fs::read_to_string(&svg).unwrap().starts_with("<svg"));
    // The correct connector leaves nothing stale.
    let o = kvgeom(&[
        "explain",
        "geometries/g5-mla-kda-mixed-kernel.toml",
        "--prompt",
        "29",
        "--alloc",
        "with-last-token",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(!text(&o).contains("stale/wrong"));
}

#[test]
fn defects_lists_every_variant_and_layout_prints_tables() {
    let o = kvgeom(&["defects"]);
    assert_eq!(o.status.code(), Some(0));
    for d in kvgeom::defects::Defect::ALL {
        assert!(text(&o).contains(d.name()));
    }
    let o = kvgeom(&["layout", "geometries/g1-mla-kda-ppl3-vs-2.toml"]);
    assert_eq!(o.status.code(), Some(0));
    assert!(text(&o).contains("local, own 4-token kernel blocks"));
}

#[test]
fn diff_and_check_trace_accept_the_original_and_fixture_formats() {
    let fixtures = Path::new("tests/fixtures/vllm-0.33.0");
    let one =
        fixtures.join("test_hetero_ppl_multi_read_writes_stay_within_request_blocks.jsonl.gz");
    for cmd in ["diff-trace", "check-trace"] {
        let o = kvgeom(&[cmd, one.to_str().unwrap()]);
        assert_eq!(o.status.code(), Some(0), "{cmd}: {}", text(&o));
    }
}

#[test]
fn policies_are_chosen_by_name_reported_and_judged_against_expectations() {
    // vLLM 0.33.0's policy fails the prefix-hit cases its finding describes...
    let geometry = "geometries/mla-kda-equal-ppl-prefix-cache.toml";
    let out = tmp("vllm.json");
    let args = [
        "sweep",
        geometry,
        "--prompts",
        "33",
        "--policy",
        "vllm-0.33.0",
        "--no-shrink",
        "--format",
        "json",
        "--out",
        out.to_str().unwrap(),
    ];
    let o = kvgeom(&args);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("--policy vllm-0.33.0"), "{}", text(&o));
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(report["schema"], "kvgeom-sweep/1");
    assert_eq!(report["cases"][0]["policy"], "vllm-0.33.0");
    assert_eq!(report["cases"][0]["defect"], serde_json::Value::Null);
    // ... which is exactly what the expectations file lists: exit 0.
    let mut expect = args.to_vec();
    expect.extend(["--expect", "expected/vllm-0.33.0.toml"]);
    let o = kvgeom(&expect);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(text(&o).contains("each as expected"), "{}", text(&o));
    // kvgeom's own connector passes them, so the same expectations disagree.
    let o = kvgeom(&[
        "sweep",
        geometry,
        "--prompts",
        "33",
        "--expect",
        "expected/vllm-0.33.0.toml",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("but it passed"), "{}", text(&o));
    // Unknown names and a policy with a defect are bad input.
    for bad in [
        vec!["sweep", geometry, "--policy", "vllm"],
        vec![
            "sweep",
            geometry,
            "--policy",
            "vllm-0.33.0",
            "--defect",
            "two-path-zeroing",
        ],
        vec!["layout", geometry, "--policy", "nope"],
        vec!["sweep", geometry, "--expect", "no/such/file.toml"],
    ] {
        let o = kvgeom(&bad);
        assert_eq!(o.status.code(), Some(2), "{bad:?}: {}", text(&o));
    }
    let o = kvgeom(&["sweep", geometry, "--policy", "vllm"]);
    assert!(
        text(&o).contains("known: kvgeom, vllm-0.33.0"),
        "{}",
        text(&o)
    );
}

#[test]
fn bench_scale_measures_each_case_against_its_touched_bytes() {
    let out = kvgeom(&[
        "bench",
        "scale",
        "geometries/deepseek-mla.toml",
        "--format",
        "json",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(report["schema"], "kvgeom-bench-scale/1");
    assert!(report["memcpy_bytes_per_second"].as_f64().unwrap() > 0.0);
    let cases = report["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 9, "one pull case per prompt length");
    for case in cases {
        assert_eq!(case["passed"], true, "{case}");
        assert!(case["touched_kv_bytes"].as_u64().unwrap() > 0, "{case}");
        assert!(case["seconds"].as_f64().unwrap() > 0.0, "{case}");
        assert!(case["prefill_ranks_touched"].as_u64() <= case["prefill_tp"].as_u64());
    }
    let table = kvgeom(&["bench", "scale", "geometries/deepseek-mla.toml"]);
    assert_eq!(table.status.code(), Some(0), "{}", text(&table));
    assert!(
        text(&table).contains("goals: peak <= 1.25x"),
        "{}",
        text(&table)
    );
    // Options of other benchmarks are refused, not ignored.
    let refused = kvgeom(&["bench", "scale", "--threads", "2"]);
    assert_eq!(refused.status.code(), Some(2), "{}", text(&refused));
    for kind in ["transport", "vram"] {
        let refused = kvgeom(&["bench", kind, "--threads", "2"]);
        assert_eq!(refused.status.code(), Some(2), "{}", text(&refused));
        assert!(text(&refused).contains("--threads"), "{}", text(&refused));
    }
    let files_elsewhere = kvgeom(&["bench", "sweep", "geometries/deepseek-mla.toml"]);
    assert_eq!(
        files_elsewhere.status.code(),
        Some(2),
        "{}",
        text(&files_elsewhere)
    );
    let missing = kvgeom(&["bench", "scale", "no/such/file.toml"]);
    assert_eq!(missing.status.code(), Some(2), "{}", text(&missing));
    assert!(
        text(&missing).contains("no/such/file.toml"),
        "{}",
        text(&missing)
    );
}

#[test]
fn mutants_samples_the_files_in_subfolders_unless_full() {
    // A folder whose only geometry lies in a subfolder, as the real-scale
    // pairs lie in geometries/models/.
    let root = tmp("mutants-sample");
    std::fs::create_dir_all(root.join("models")).unwrap();
    let g1 = std::fs::read_to_string("geometries/g1-mla-kda-ppl3-vs-2.toml").unwrap();
    let g1 = g1.replace("prompts = [\"2..=39\"]", "prompts = [\"2..=4\"]");
    std::fs::write(root.join("models/g1.toml"), g1).unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec!["mutants", root.to_str().unwrap(), "--format", "json"];
        args.extend_from_slice(extra);
        let o = kvgeom(&args);
        assert!(matches!(o.status.code(), Some(0 | 1)), "{}", text(&o));
        serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()
    };
    let sampled = run(&[]);
    assert_eq!(sampled["schema"], "kvgeom-mutants/1");
    assert_eq!(sampled["sample"]["full"], false);
    let files = sampled["sample"]["sampled_files"].as_array().unwrap();
    assert_eq!(files.len(), 1);
    assert!(files[0].as_str().unwrap().ends_with("models/g1.toml"));
    let defects = sampled["defects"].as_array().unwrap();
    assert_eq!(defects.len(), kvgeom::defects::Defect::ALL.len());
    // One prompt length in both modes with the mainline allocation.
    assert!(defects.iter().all(|d| d["cases"] == 2), "{sampled}");
    let full = run(&["--full"]);
    assert_eq!(full["sample"]["full"], true);
    assert!(full["sample"]["sampled_files"]
        .as_array()
        .unwrap()
        .is_empty());
    // 3 prompt lengths x 2 modes x 2 allocations.
    assert!(full["defects"]
        .as_array()
        .unwrap()
        .iter()
        .all(|d| d["cases"] == 12));
    // The table says what it sampled.
    let o = kvgeom(&["mutants", root.to_str().unwrap()]);
    assert!(
        text(&o).starts_with("sampled: 1 file(s) in subfolders"),
        "{}",
        text(&o)
    );
}

/// clap's own usage errors (unknown option, bad value) also exit 2; an
/// option that parsed never gets one.
fn parse_error(o: &Output) -> bool {
    String::from_utf8_lossy(&o.stderr).contains("For more information, try '--help'")
}

/// Every option of each subcommand's `--help`: the help lists it.
#[test]
fn each_subcommands_help_lists_its_documented_options() {
    let table: &[(&[&str], &[&str])] = &[
        (
            &["sweep"],
            &[
                "--prompts",
                "--mode",
                "--alloc",
                "--transport",
                "--memory",
                "--policy",
                "--defect",
                "--random",
                "--seed",
                "--threads",
                "--format",
                "--out",
                "--no-shrink",
                "--compare-host",
                "--expect",
                "--max-memory",
                "--shard",
                "--connector",
                "--vllm-python",
                "--nixl",
                "--record-traces",
            ],
        ),
        (
            &["explain"],
            &[
                "--prompt ",
                "--prefix-hit",
                "--mode",
                "--alloc",
                "--seed",
                "--policy",
                "--defect",
                "--transport",
                "--svg",
                "--max-memory",
                "--connector",
                "--vllm-python",
                "--nixl",
                "--record-trace ",
            ],
        ),
        (&["layout"], &["--mode", "--policy", "--defect"]),
        (&["check-trace"], &["--format", "--max-memory"]),
        (
            &["diff-trace"],
            &["--policy", "--defect", "--format", "--max-memory"],
        ),
        (&["report", "merge"], &["--out"]),
        (
            &["mutants"],
            &["--threads", "--full", "--format", "--max-memory"],
        ),
        (
            &["bench"],
            &[
                "--format",
                "--threads",
                "--geometry",
                "--prompt",
                "--iterations",
                "--memory",
                "--op",
                "--peer-process",
                "--paths",
                "--max-memory",
            ],
        ),
        (&["bench-peer"], &["--geometry", "--prompt", "--memory"]),
    ];
    for (sub, options) in table {
        let mut args = sub.to_vec();
        args.push("--help");
        let o = kvgeom(&args);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {}", text(&o));
        let help = String::from_utf8_lossy(&o.stdout);
        for option in *options {
            assert!(
                help.contains(option),
                "{sub:?} --help lacks {option}: {help}"
            );
        }
    }
}

/// Each subcommand's documented options, given together, parse and apply:
/// the command runs (or, where running it would take long or needs vLLM,
/// stops at the check of an option it applies) with the exit status
/// listed, never a usage error.
#[test]
fn each_subcommands_documented_options_parse_and_apply() {
    let dir = tmp("options");
    std::fs::create_dir_all(&dir).unwrap();
    let d = dir.display();
    let g1 = "geometries/g1-mla-kda-ppl3-vs-2.toml";
    let g5 = "geometries/g5-mla-kda-mixed-kernel.toml";
    let trace = "tests/fixtures/vllm-0.33.0/\
                 test_hetero_ppl_multi_read_writes_stay_within_request_blocks.jsonl.gz";
    let qwen = "tests/fixtures/models/qwen3-next-80b-a3b.json";
    let no_python = "--vllm-python no/such/python";
    // (command line, exit status, text the output must hold)
    let table: Vec<(String, i32, &str)> = vec![
        (
            format!(
                "sweep {g1} --prompts 2..=3 --mode pull --alloc mainline \
                 --transport loopback --memory host --policy kvgeom --seed 1 \
                 --threads 1 --format json --out {d}/a.json --no-shrink \
                 --compare-host --max-memory 1G --shard 1/1 --connector kvgeom"
            ),
            0,
            "all 2 cases give the same results",
        ),
        (
            format!("sweep {g1} --random 3 --seed 7 --format junit"),
            0,
            "<testsuites",
        ),
        (
            format!(
                "sweep {g5} --mode pull --alloc with-last-token \
                 --defect two-path-zeroing --no-shrink"
            ),
            1,
            "cases failed",
        ),
        (
            format!(
                "sweep {g1} --prompts 33 --policy vllm-0.33.0 \
                 --expect expected/vllm-0.33.0.toml"
            ),
            0,
            "each as expected",
        ),
        (
            format!("sweep {g1} --prompts 2 --shard 1/2 --format json --out {d}/s1.json"),
            0,
            "shard 1/2",
        ),
        (
            format!("sweep {g1} --prompts 2 --shard 2/2 --format json --out {d}/s2.json"),
            0,
            "shard 2/2",
        ),
        (
            format!("report merge {d}/s1.json {d}/s2.json --out {d}/merged.json"),
            0,
            "",
        ),
        // The live mode's options: the budget is checked before an
        // interpreter is looked for, and then the interpreter named.
        (
            format!(
                "sweep {g1} --connector vllm --prompts 2..=3 --mode pull \
                 --alloc mainline --transport loopback --memory host --random 2 \
                 --seed 1 --threads 1 --format json --out {d}/l.json --no-shrink \
                 --expect expected/vllm-0.33.0.toml --shard 1/1 {no_python} \
                 --nixl stand-in --record-traces {d}/traces --max-memory 1K"
            ),
            2,
            "more than --max-memory 1.0 KiB",
        ),
        (
            format!("sweep {g1} --connector vllm {no_python} --nixl auto"),
            2,
            "--vllm-python no/such/python",
        ),
        (
            format!(
                "explain {g5} --prompt 29 --prefix-hit 0 --mode push \
                 --alloc with-last-token --seed 3 --policy kvgeom \
                 --transport loopback --svg {d}/e.svg --max-memory 1G \
                 --connector kvgeom"
            ),
            0,
            "transferred",
        ),
        (
            format!(
                "explain {g5} --prompt 29 --alloc with-last-token \
                 --defect two-path-zeroing"
            ),
            1,
            "stale",
        ),
        (
            format!(
                "explain {g1} --connector vllm --prompt 5 --prefix-hit 0 \
                 --mode push --alloc with-last-token --seed 1 --transport loopback \
                 {no_python} --nixl real --record-trace {d}/t.jsonl --max-memory 1K"
            ),
            2,
            "more than --max-memory 1.0 KiB",
        ),
        (
            format!("explain {g1} --prompt 5 --connector vllm {no_python}"),
            2,
            "--vllm-python no/such/python",
        ),
        (
            format!("layout {g1} --mode both --policy vllm-0.33.0"),
            0,
            "local",
        ),
        (
            format!("layout {g1} --mode push --defect two-path-zeroing"),
            0,
            "local",
        ),
        (
            format!("derive {qwen} --tp 1 --backend FLASHINFER --gpu sm90 --format toml"),
            0,
            "",
        ),
        (
            format!("check-trace {trace} --format json --max-memory 1G"),
            0,
            "kvgeom-trace-verdicts/1",
        ),
        (
            format!("diff-trace {trace} --policy kvgeom --format json --max-memory 1G"),
            0,
            "kvgeom-trace-verdicts/1",
        ),
        (
            format!("diff-trace {trace} --defect two-path-zeroing --format text"),
            0,
            "1 match",
        ),
        ("defects".into(), 0, "two-path-zeroing"),
        (
            format!("mutants {g1} --threads 1 --full --format json --max-memory 1K"),
            2,
            "--max-memory 1.0 KiB",
        ),
        (
            "bench scale geometries/deepseek-mla.toml --format json --max-memory 1G".into(),
            0,
            "kvgeom-bench-scale/1",
        ),
        (
            format!(
                "bench vram --geometry {g1} --prompt 5 --iterations 1 --memory host \
                 --op write --paths copy --max-memory 1K"
            ),
            2,
            "--max-memory",
        ),
        (
            "bench transport --paths memcpy --max-memory 1K".into(),
            2,
            "--max-memory",
        ),
    ];
    for (line, code, shows) in &table {
        let args: Vec<&str> = line.split_whitespace().collect();
        let o = kvgeom(&args);
        assert!(!parse_error(&o), "{line}: {}", text(&o));
        assert_eq!(o.status.code(), Some(*code), "{line}: {}", text(&o));
        assert!(
            text(&o).contains(shows),
            "{line} should say {shows:?}: {}",
            text(&o)
        );
    }
}

/// An option that does not apply to the connector chosen is refused with
/// exit 2 and one line naming it, before anything runs.
#[test]
fn options_of_the_other_connector_are_refused_by_name() {
    let sweep = "sweep geometries/g1-mla-kda-ppl3-vs-2.toml --prompts 2";
    let explain = "explain geometries/g1-mla-kda-ppl3-vs-2.toml --prompt 5";
    // (options added to `sweep` or `explain`, the option refused)
    let table = [
        // kvgeom's connector: the live mode's options.
        (sweep, "--nixl stand-in", "--nixl"),
        (sweep, "--vllm-python python3", "--vllm-python"),
        (explain, "--nixl real", "--nixl"),
        (explain, "--vllm-python python3", "--vllm-python"),
        // vLLM's connector: kvgeom's variants, transport and memory.
        (
            sweep,
            "--connector vllm --defect two-path-zeroing",
            "--defect",
        ),
        (sweep, "--connector vllm --policy kvgeom", "--policy"),
        (sweep, "--connector vllm --memory vram", "--memory"),
        (sweep, "--connector vllm --transport nixl", "--transport"),
        (sweep, "--connector vllm --compare-host", "--compare-host"),
        (
            explain,
            "--connector vllm --defect two-path-zeroing",
            "--defect",
        ),
        (explain, "--connector vllm --policy kvgeom", "--policy"),
        (explain, "--connector vllm --transport nixl", "--transport"),
        (explain, "--connector vllm --svg x.svg", "--svg"),
    ];
    for (command, options, option) in table {
        let line = format!("{command} {options}");
        let o = kvgeom(&line.split_whitespace().collect::<Vec<_>>());
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{line}: {}", text(&o));
        assert!(!parse_error(&o), "{line}: {err}");
        assert_eq!(err.lines().count(), 1, "{line}: one line: {err}");
        assert!(err.contains(option), "{line} names {option}: {err}");
        assert!(o.stdout.is_empty(), "{line}: nothing runs: {}", text(&o));
    }
}

/// A plan-differences file that cannot be used is exit 2 before the
/// interpreter is probed or any case runs (here there is no interpreter at
/// all), the error naming the problem; the two plan options need
/// `--connector vllm`, and an unknown `--compare-policy` is named.
#[test]
fn a_bad_plan_differences_file_is_exit_2_before_any_case_runs() {
    let entry = "[[difference]]\ngeometry = \"gqa-kernel-ratio4\"\ncases = \"all\"\n\
                 finding = \"vllm-0.34.0-last-token-pairing.md\"\nreason = \"an example\"\n";
    for (name, body, needle) in [
        (
            "missing-finding.toml",
            entry.replace("vllm-0.34.0-last-token-pairing.md", "no-such-finding.md"),
            "finding `no-such-finding.md`: no such page",
        ),
        (
            "unknown-key.toml",
            entry.replace("reason =", "because ="),
            "unknown field `because`",
        ),
        (
            "bad-selector.toml",
            entry.replace("\"all\"", "[\"13\"]"),
            "case `13`: expected PROMPTS/HIT",
        ),
    ] {
        let file = tmp(name);
        std::fs::write(&file, body).unwrap();
        let o = kvgeom(&[
            "sweep",
            "--connector",
            "vllm",
            "--vllm-python",
            "/nonexistent/bin/python",
            "--plan-differences",
            file.to_str().unwrap(),
            "geometries/gqa-kernel-ratio4.toml",
        ]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{name}: {err}");
        assert!(err.contains(needle), "{name}: {err}");
        assert!(
            err.contains(name),
            "{name}: the error names the file: {err}"
        );
        assert!(!err.contains("no Python interpreter"), "{name}: {err}");
        assert!(!err.contains("panicked"), "{name}: {err}");
    }
    let o = kvgeom(&[
        "sweep",
        "--connector",
        "vllm",
        "--vllm-python",
        "/nonexistent/bin/python",
        "--plan-differences",
        "/nonexistent/plan-differences.toml",
        "geometries/gqa-kernel-ratio4.toml",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o).contains("/nonexistent/plan-differences.toml"),
        "{}",
        text(&o)
    );
    let o = kvgeom(&[
        "sweep",
        "--connector",
        "vllm",
        "--vllm-python",
        "/nonexistent/bin/python",
        "--compare-policy",
        "vllm-9",
        "geometries/gqa-kernel-ratio4.toml",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o).contains("--compare-policy vllm-9: unknown policy; known: "),
        "{}",
        text(&o)
    );
    for option in ["--plan-differences", "--compare-policy"] {
        let o = kvgeom(&["sweep", option, "x", "geometries/gqa-kernel-ratio4.toml"]);
        assert_eq!(o.status.code(), Some(2), "{option}");
        assert!(
            text(&o).contains(&format!(
                "{option}: applies to the plans of vLLM's connector"
            )),
            "{}",
            text(&o)
        );
    }
}
