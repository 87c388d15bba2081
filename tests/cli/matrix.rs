//! `kvgeom matrix` without a vLLM: an interpreter the driver cannot use is a
//! column of `not run` and the matrix goes on; bad input is exit 2.

use crate::support::{kvgeom, text};

#[test]
fn an_interpreter_that_cannot_run_is_a_column_of_not_run_and_the_matrix_goes_on() {
    let out = std::env::temp_dir().join(format!("kvgeom-matrix-test-{}.json", std::process::id()));
    let o = kvgeom(&[
        "matrix",
        "--vllm-python",
        "/nonexistent/kvgeom/python",
        "--vllm-python",
        "/bin/false",
        "--prompts",
        "17",
        "--out",
        out.to_str().unwrap(),
        "geometries/deepseek-mla.toml",
    ]);
    let all = text(&o);
    assert_eq!(o.status.code(), Some(0), "{all}");
    assert!(all.contains("deepseek-mla pull"), "{all}");
    assert!(
        all.contains("/nonexistent/kvgeom/python: not run: no Python interpreter"),
        "{all}"
    );
    assert!(all.contains("/bin/false: not run:"), "{all}");
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let _ = std::fs::remove_file(&out);
    assert_eq!(doc["schema"], "kvgeom-matrix/1");
    assert_eq!(doc["geometries"], serde_json::json!(["deepseek-mla"]));
    let releases = doc["releases"].as_array().unwrap();
    assert_eq!(releases.len(), 2);
    for r in releases {
        assert_eq!(r["status"], "not_run");
        assert!(r["not_run"].as_str().is_some_and(|w| !w.is_empty()), "{r}");
    }
    let cells = doc["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 4, "2 modes x 2 releases");
    assert!(cells.iter().all(|c| c["not_run"] == true));
}

#[test]
fn bad_input_is_exit_2() {
    for args in [
        vec!["matrix", "geometries/deepseek-mla.toml"],
        vec!["matrix", "--vllm-python", "/bin/false", "--prompts", "0"],
        vec![
            "matrix",
            "--vllm-python",
            "/bin/false",
            "no/such/geometry.toml",
        ],
    ] {
        let o = kvgeom(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
    }
}

#[test]
fn requests_parse_as_the_sweeps_and_scheduler_with_last_token_is_refused() {
    for who in ["direct", "scheduler"] {
        let o = kvgeom(&[
            "matrix",
            "--vllm-python",
            "/bin/false",
            "--prompts",
            "17",
            "--requests",
            who,
            "geometries/deepseek-mla.toml",
        ]);
        let all = text(&o);
        assert_eq!(o.status.code(), Some(0), "--requests {who}: {all}");
        assert!(all.contains("/bin/false: not run:"), "{all}");
    }
    let o = kvgeom(&[
        "matrix",
        "--vllm-python",
        "/bin/false",
        "--requests",
        "scheduler",
        "--alloc",
        "with-last-token",
        "geometries/deepseek-mla.toml",
    ]);
    let all = text(&o);
    assert_eq!(o.status.code(), Some(2), "{all}");
    assert!(
        all.contains("--requests scheduler --alloc with-last-token"),
        "{all}"
    );
    assert!(
        !all.contains("not run"),
        "refused before any release runs: {all}"
    );
    let o = kvgeom(&[
        "matrix",
        "--vllm-python",
        "/bin/false",
        "--requests",
        "nobody",
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
}
