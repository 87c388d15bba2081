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
        .filter(|p| p.is_file() && p.extension().is_none())
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

/// Every scenario input still decodes to the case it was minimized to (its
/// `<name>.case` file, the case's `Debug` form). A generator change that
/// shifts the decoding would otherwise turn the input into some other case
/// and silently stop guarding the bug; re-minimize the crash from the
/// `.case` file's geometry and replay command, then rewrite both files.
#[test]
fn scenario_regressions_still_decode_to_their_cases() {
    let files = inputs("scenario");
    assert!(
        !files.is_empty(),
        "tests/regressions/scenario/ holds no input"
    );
    for file in files {
        let bytes = std::fs::read(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let case = GeneratedCase::from_bytes(&bytes).expect("the generator accepts any bytes");
        let pinned_path = file.with_extension("case");
        let decoded = format!("{case:?}\n");
        if std::env::var_os("KVGEOM_PIN_REGRESSIONS").is_some() {
            std::fs::write(&pinned_path, &decoded).expect("write the .case file");
            continue;
        }
        let pinned = std::fs::read_to_string(&pinned_path).unwrap_or_else(|e| {
            panic!(
                "{}: {e} (write it with KVGEOM_PIN_REGRESSIONS=1 cargo test --test connector regressions::)",
                pinned_path.display()
            )
        });
        assert_eq!(
            decoded,
            pinned,
            "{} no longer decodes to the case in {}",
            file.display(),
            pinned_path.display()
        );
    }
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
        targets::plan(&input, None);
    });
}
