//! Inputs that once made a cargo-fuzz target fail, replayed as plain tests
//! through the targets' own glue (`kvgeom::generate::targets`): one folder
//! per target under `tests/regressions/`, one raw input file each (the
//! bytes libFuzzer wrote to `fuzz/artifacts/<target>/`, minimized with
//! `cargo fuzz tmin`). See `tests/regressions/README.md`.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use kvgeom::generate::{targets, GeneratedCase, PlanInput};

fn inputs(target: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/regressions")
        .join(target);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

/// Replay every input of `target`; fail once, naming every input that fails.
fn replay(target: &str, run: fn(&[u8])) -> usize {
    let files = inputs(target);
    let failed: Vec<String> = files
        .iter()
        .filter_map(|file| {
            let bytes = std::fs::read(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            catch_unwind(AssertUnwindSafe(|| run(&bytes)))
                .err()
                .map(|_| file.display().to_string())
        })
        .collect();
    assert!(
        failed.is_empty(),
        "{target}: {} of {} regression inputs fail again (messages above); \
         replay one with `cargo fuzz run {target} <file>`:\n{}",
        failed.len(),
        files.len(),
        failed.join("\n")
    );
    files.len()
}

#[test]
fn scenario_regressions_pass() {
    let n = replay("scenario", |bytes| {
        let case = GeneratedCase::from_bytes(bytes).expect("the generator accepts any bytes");
        targets::scenario(&case, None);
    });
    assert!(n > 0, "tests/regressions/scenario/ holds no input");
}

#[test]
fn geometry_file_regressions_pass() {
    replay("geometry_file", targets::geometry_file);
}

#[test]
fn trace_regressions_pass() {
    replay("trace", targets::trace);
}

#[test]
fn plan_regressions_pass() {
    replay("plan", |bytes| {
        let input = PlanInput::from_bytes(bytes).expect("the generator accepts any bytes");
        targets::plan(&input);
    });
}
