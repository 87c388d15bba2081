//! What the integration-test binaries share: the project root and its trace
//! fixtures, running the `kvgeom` binary, scratch folders, and reporting a
//! skipped test in the one form `.ci/run` looks for. Each binary includes
//! this module (`#[path = "../support/mod.rs"] mod support;`) and uses what
//! it needs; a helper two test files need belongs here, not in both.

#![allow(dead_code)]

pub mod conformance;
pub mod harness;
pub mod transport_scenarios;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

/// The project root (where `Cargo.toml` is).
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The `kvgeom` binary built for the tests, run from the project root.
pub fn kvgeom_command() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_kvgeom"));
    command.current_dir(root());
    command
}

/// Run `kvgeom ARGS` from the project root.
pub fn kvgeom(args: &[&str]) -> Output {
    kvgeom_with_env(args, &[])
}

/// Run `kvgeom ARGS` from the project root with `env` added to its
/// environment.
pub fn kvgeom_with_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    kvgeom_command()
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("kvgeom runs")
}

/// What a command printed, stdout then stderr.
pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A finished command: its exit status and everything it printed.
pub struct Run {
    pub code: Option<i32>,
    pub text: String,
}

impl From<Output> for Run {
    fn from(o: Output) -> Self {
        Run {
            code: o.status.code(),
            text: text(&o),
        }
    }
}

/// Run `kvgeom ARGS` from the project root; its status and text.
pub fn kvgeom_run(args: &[&str]) -> Run {
    kvgeom(args).into()
}

/// A command's stdout as JSON; panics with everything it printed otherwise.
pub fn json_report(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", text(o)))
}

/// A fresh empty folder for one test below the tests' temporary folder:
/// `scratch(module_path!(), "name")`, so that modules of one binary never
/// share a folder.
pub fn scratch(module: &str, name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(module.replace("::", "-"))
        .join(name);
    if dir.exists() {
        std::fs::remove_dir_all(&dir).expect("empty the scratch folder");
    }
    std::fs::create_dir_all(&dir).expect("create the scratch folder");
    dir
}

/// The folder of the recorded vLLM 0.33.0 v1 traces.
pub fn v1_trace_dir() -> PathBuf {
    root().join("tests/fixtures/vllm-0.33.0")
}

/// One v1 trace fixture, by file name (`….jsonl.gz`).
pub fn v1_trace(file: &str) -> PathBuf {
    v1_trace_dir().join(file)
}

/// Every v1 trace fixture, sorted by path.
pub fn v1_traces() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(v1_trace_dir())
        .expect("the v1 fixture folder")
        .map(|e| e.expect("a folder entry").path())
        .filter(|p| p.to_string_lossy().ends_with(".jsonl.gz"))
        .collect();
    files.sort();
    files
}

/// One v2 trace fixture of the live driver, by case name.
pub fn v2_trace(name: &str) -> PathBuf {
    root()
        .join("tests/fixtures/live-traces-vllm-0.33.0")
        .join(format!("{name}.trace.json.gz"))
}

/// A v1 trace's events, one JSON object per line.
pub fn trace_lines(path: &Path) -> Vec<Value> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let text = kvgeom::trace::decompress(path, &bytes).expect("the trace decompresses");
    String::from_utf8(text)
        .expect("the trace is UTF-8")
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("each line is JSON"))
        .collect()
}

/// Say that `test` is skipped and why, as `TEST: skipped: WHY` on stdout:
/// `.ci/run` fails a step whose tests must all run when it sees this line.
pub fn skip(test: &str, why: impl std::fmt::Display) {
    println!("{test}: skipped: {why}");
}

/// An executable `DIR/python` that runs `python` with `site` on PYTHONPATH.
pub fn python_with_site(dir: &Path, site: &Path, python: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let wrapper = dir.join("python");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nPYTHONPATH='{}' exec '{python}' \"$@\"\n",
            site.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    wrapper
}

/// The geometries of vLLM's stack among `sources`: what kvgeom's and vLLM's
/// connectors run (`stack = "sglang"` files are SGLang's).
pub fn vllm_stack(
    sources: Vec<kvgeom::sweep::plan::SourcedGeometry>,
) -> Vec<kvgeom::sweep::plan::SourcedGeometry> {
    sources
        .into_iter()
        .filter(|s| s.geometry.stack == kvgeom::geometry::Stack::Vllm)
        .collect()
}

/// The interpreter of vLLM `version`'s venv as `scripts/install-vllm.sh`
/// lays them out: `.vllm-venv/` for the pinned release, `.vllm-venvs/X/`
/// for another one.
pub fn vllm_venv_python(version: &str) -> PathBuf {
    if version == kvgeom::under_test::Release::pinned().version {
        root().join(".vllm-venv/bin/python")
    } else {
        root().join(format!(".vllm-venvs/{version}/bin/python"))
    }
}

/// The command that installs vLLM `version` where [`vllm_venv_python`]
/// looks for it, for skip messages.
pub fn vllm_install_command(version: &str) -> String {
    if version == kvgeom::under_test::Release::pinned().version {
        "scripts/install-vllm.sh".to_string()
    } else {
        format!("scripts/install-vllm.sh --version {version} --torch-from .vllm-venv")
    }
}
