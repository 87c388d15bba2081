//! `kvgeom sweep --shard K/N` and `kvgeom report merge`: the N shards'
//! reports, merged, are the report and exit status of the unsharded run, in
//! JSON and in JUnit; a missing, repeated, mismatched or foreign shard is
//! refused with exit 2 and a message naming the file.

use std::path::Path;

use crate::support::{kvgeom_run, scratch, Run};

fn path(dir: &Path, name: &str) -> String {
    dir.join(name).display().to_string()
}

/// Two geometries, one of which fails every case under the defect: the
/// sweep exits 1 with passing and failing cases in two suites.
const SWEEP: &[&str] = &[
    "sweep",
    "geometries/g1-mla-kda-ppl3-vs-2.toml",
    "geometries/g5-mla-kda-mixed-kernel.toml",
    "--prompts",
    "2..=9",
    "--mode",
    "pull",
    "--defect",
    "two-path-zeroing",
    "--no-shrink",
];

/// Run `SWEEP` plus `extra` writing `--format format` to `out`; its exit status.
fn sweep(extra: &[&str], format: &str, out: &str) -> Option<i32> {
    let mut args: Vec<&str> = SWEEP.to_vec();
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--format", format, "--out", out]);
    let run = kvgeom_run(&args);
    assert!(matches!(run.code, Some(0 | 1)), "{args:?}:\n{}", run.text);
    run.code
}

/// The unsharded report and status, and the `count` shards' report files.
fn whole_and_shards(
    dir: &Path,
    extra: &[&str],
    format: &str,
    count: u32,
) -> (String, Option<i32>, Vec<String>) {
    let whole = path(dir, &format!("whole.{format}"));
    let code = sweep(extra, format, &whole);
    let shards = (1..=count)
        .map(|k| {
            let file = path(dir, &format!("s{k}of{count}.{format}"));
            let shard = format!("{k}/{count}");
            let mut args = extra.to_vec();
            args.extend_from_slice(&["--shard", &shard]);
            sweep(&args, format, &file);
            file
        })
        .collect();
    (std::fs::read_to_string(&whole).unwrap(), code, shards)
}

fn merge(files: &[String], out: &str) -> Run {
    let mut args = vec!["report", "merge"];
    args.extend(files.iter().map(String::as_str));
    args.extend_from_slice(&["--out", out]);
    kvgeom_run(&args)
}

#[test]
fn merged_json_shards_are_the_unsharded_report() {
    let dir = scratch(module_path!(), "json");
    let (whole, code, shards) = whole_and_shards(&dir, &[], "json", 3);
    assert_eq!(code, Some(1), "the sweep has failing cases");
    let out = path(&dir, "merged.json");
    // The shards in any order.
    let given = [shards[2].clone(), shards[0].clone(), shards[1].clone()];
    let run = merge(&given, &out);
    assert_eq!(run.code, code, "{}", run.text);
    let merged: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let whole: serde_json::Value = serde_json::from_str(&whole).unwrap();
    assert_eq!(merged, whole);
    assert_eq!(merged["summary"]["cases"], 32);
    assert_eq!(merged["code_under_test"]["connector"], "kvgeom");
    let shard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&shards[1]).unwrap()).unwrap();
    assert_eq!(shard["shard"]["index"], 2);
    assert_eq!(shard["shard"]["total_cases"], 32);
    assert_eq!(shard["cases"][0]["index"], 1);
}

#[test]
fn merged_junit_shards_are_the_unsharded_report() {
    let dir = scratch(module_path!(), "junit");
    let (whole, code, shards) = whole_and_shards(&dir, &[], "junit", 3);
    assert_eq!(code, Some(1), "the sweep has failing cases");
    assert!(whole.contains("<failure "), "{whole}");
    let shard = std::fs::read_to_string(&shards[1]).unwrap();
    for needle in [
        "<property name=\"kvgeom.shard\" value=\"2/3\"/>",
        "<property name=\"kvgeom.total_cases\" value=\"32\"/>",
        "<property name=\"kvgeom.fingerprint\" value=\"",
        "<property name=\"kvgeom.index\" value=\"1\"/>",
        "<property name=\"kvgeom.code_under_test.connector\" value=\"kvgeom\"/>",
    ] {
        assert!(shard.contains(needle), "no `{needle}` in {shard}");
    }
    let out = path(&dir, "merged.xml");
    let given = [shards[1].clone(), shards[2].clone(), shards[0].clone()];
    let run = merge(&given, &out);
    assert_eq!(run.code, code, "{}", run.text);
    // The JUnit report has no timings: the merge is byte for byte the run's.
    assert_eq!(std::fs::read_to_string(&out).unwrap(), whole);

    // A random draw interleaves the geometries; each suite still holds its
    // own cases once, in sweep order, and the merge is again the run's.
    let (whole, code, shards) =
        whole_and_shards(&dir, &["--random", "30", "--seed", "3"], "junit", 4);
    assert_eq!(whole.matches("<testsuite ").count(), 2, "{whole}");
    assert_eq!(whole.matches("<testcase ").count(), 30, "{whole}");
    let run = merge(&shards, &out);
    assert_eq!(run.code, code, "{}", run.text);
    assert_eq!(std::fs::read_to_string(&out).unwrap(), whole);
}

#[test]
fn a_passing_sweep_merges_to_exit_0() {
    let dir = scratch(module_path!(), "passing");
    let mut files = Vec::new();
    for format in ["json", "junit"] {
        let whole = path(&dir, &format!("whole.{format}"));
        let base = [
            "sweep",
            "geometries/g1-mla-kda-ppl3-vs-2.toml",
            "--prompts",
            "2..=4",
        ];
        let mut args = base.to_vec();
        args.extend_from_slice(&["--format", format, "--out", &whole]);
        assert_eq!(kvgeom_run(&args).code, Some(0));
        files.clear();
        // More shards than cases: some shards are empty, and still merge.
        for k in 1..=13 {
            let file = path(&dir, &format!("s{k}.{format}"));
            let shard = format!("{k}/13");
            let mut args = base.to_vec();
            args.extend_from_slice(&["--shard", &shard, "--format", format, "--out", &file]);
            assert_eq!(kvgeom_run(&args).code, Some(0));
            files.push(file);
        }
        let out = path(&dir, &format!("merged.{format}"));
        let run = merge(&files, &out);
        assert_eq!(run.code, Some(0), "{}", run.text);
        let (merged, whole) = (
            std::fs::read_to_string(&out).unwrap(),
            std::fs::read_to_string(&whole).unwrap(),
        );
        if format == "json" {
            let parse = |t: &str| serde_json::from_str::<serde_json::Value>(t).unwrap();
            assert_eq!(parse(&merged), parse(&whole));
        } else {
            assert_eq!(merged, whole);
        }
    }
}

/// `report merge FILES` exits 2 with a message holding every needle, once
/// for the first.
fn refused(files: &[&str], needles: &[&str]) {
    let mut args = vec!["report", "merge"];
    args.extend_from_slice(files);
    let run = kvgeom_run(&args);
    assert_eq!(run.code, Some(2), "{files:?}:\n{}", run.text);
    assert!(
        run.text.starts_with("error: ") && run.text.lines().count() == 1,
        "{files:?}: not one error line:\n{}",
        run.text
    );
    for needle in needles {
        assert!(
            run.text.contains(needle),
            "{files:?}: no `{needle}` in:\n{}",
            run.text
        );
    }
    assert_eq!(
        run.text.matches(needles[0]).count(),
        1,
        "{files:?}: `{}` more than once in:\n{}",
        needles[0],
        run.text
    );
}

#[test]
fn missing_repeated_mismatched_and_foreign_shards_are_refused() {
    let dir = scratch(module_path!(), "refusals");
    let (_, _, json) = whole_and_shards(&dir, &[], "json", 3);
    let (whole_xml, _, xml) = whole_and_shards(&dir, &[], "junit", 3);
    let (j1, j2, j3) = (json[0].as_str(), json[1].as_str(), json[2].as_str());
    let (x1, x2, x3) = (xml[0].as_str(), xml[1].as_str(), xml[2].as_str());
    for (s1, s2, s3) in [(j1, j2, j3), (x1, x2, x3)] {
        refused(
            &[s1, s3],
            &["shard 2/3 is missing (given: 1/3, 3/3)", "every shard"],
        );
        refused(
            &[s1, s2, s2, s3],
            &[&format!("shard 2/3 is given twice: {s2} and {s2}")],
        );
    }
    refused(
        &[j1, x2, j3],
        &[
            &format!("{x2} is a JUnit report but {j1} is JSON"),
            "one format",
        ],
    );
    refused(
        &[x1, j2, x3],
        &[
            &format!("{j2} is a JSON report but {x1} is JUnit"),
            "one format",
        ],
    );

    // Shards of another sweep: other options, or another shard count.
    let other = path(&dir, "other.junit");
    sweep(&["--seed", "1", "--shard", "2/3"], "junit", &other);
    refused(
        &[x1, &other, x3],
        &[
            &format!("{other}: property kvgeom.fingerprint is `"),
            &format!("but {x1} has `"),
            "not shards of one sweep",
        ],
    );
    let other_json = path(&dir, "other.json");
    sweep(&["--shard", "2/4"], "json", &other_json);
    refused(
        &[j1, &other_json, j3],
        &[
            &format!("{other_json}: `shard.count` is 4, but {j1} has 3"),
            "not shards of one sweep",
        ],
    );

    // Reports written without --shard.
    let whole_json = path(&dir, "whole.json");
    let whole_junit = path(&dir, "whole.junit");
    refused(
        &[&whole_json],
        &[&format!(
            "{whole_json}: no `shard`: written without --shard"
        )],
    );
    refused(
        &[&whole_junit],
        &[&format!(
            "{whole_junit}: no property kvgeom.shard: written without --shard"
        )],
    );

    // A shard that lost a case, or whose case moved.
    let edited = dir.join("edited.junit");
    let first_case = x2.to_string();
    let text = std::fs::read_to_string(&first_case).unwrap();
    std::fs::write(&edited, text.replace("value=\"4\"/>", "value=\"5\"/>")).unwrap();
    let edited = edited.display().to_string();
    refused(
        &[x1, &edited, x3],
        &[&format!(
            "{edited}: property kvgeom.index 5: a case of shard 3/3, not of this shard 2/3"
        )],
    );
    let shrunk = path(&dir, "shrunk.json");
    let mut value: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(j2).unwrap()).unwrap();
    value["cases"].as_array_mut().unwrap().pop();
    std::fs::write(&shrunk, value.to_string()).unwrap();
    refused(
        &[j1, &shrunk, j3],
        &[&format!(
            "{shrunk}: shard 2/3 of a sweep of 32 cases (`shard.total_cases`) holds 10 cases; it must hold 11"
        )],
    );
    let lied = path(&dir, "lied.junit");
    std::fs::write(&lied, whole_xml.replacen("tests=\"32\"", "tests=\"31\"", 1)).unwrap();
    refused(
        &[&lied],
        &[&format!(
            "{lied}: not a kvgeom JUnit sweep report: <testsuites> says tests=\"31\" failures=\"16\" but holds 32 testcases, 16 failing"
        )],
    );

    // Not a report at all, or not kvgeom's.
    let empty = path(&dir, "empty.json");
    std::fs::write(&empty, "").unwrap();
    refused(
        &[&empty],
        &[&format!(
            "{empty}: neither a JSON nor a JUnit sweep report: the file is empty"
        )],
    );
    let toml = "geometries/g1-mla-kda-ppl3-vs-2.toml";
    refused(
        &[toml],
        &[&format!(
            "{toml}: neither a JSON nor a JUnit sweep report: it starts with `"
        )],
    );
    let pytest = path(&dir, "pytest.xml");
    std::fs::write(
        &pytest,
        "<testsuites name=\"pytest\" tests=\"0\" failures=\"0\"/>",
    )
    .unwrap();
    refused(
        &[&pytest],
        &[&format!(
            "{pytest}: not a kvgeom JUnit sweep report: at byte 0: the root is <testsuites name=\"pytest\">"
        )],
    );
    let broken = path(&dir, "broken.xml");
    std::fs::write(&broken, &whole_xml[..whole_xml.len() / 2]).unwrap();
    refused(
        &[&broken],
        &[&format!("{broken}: not a kvgeom JUnit sweep report:")],
    );
    let other_schema = path(&dir, "schema.json");
    std::fs::write(&other_schema, "{\"schema\": \"kvgeom-bench/1\"}").unwrap();
    refused(
        &[&other_schema],
        &[&format!(
            "{other_schema}: `schema` is `kvgeom-bench/1`; report merge reads `kvgeom-sweep/1`"
        )],
    );
    refused(&["/dev/null"], &["/dev/null: not a regular file"]);
}
