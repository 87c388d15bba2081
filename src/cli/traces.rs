//! `kvgeom check-trace` and `kvgeom diff-trace`.

use std::path::PathBuf;

use super::{VariantArgs, EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK};
use crate::trace::check::check_case;
use crate::trace::{diff_against_connector, TraceCase};

fn expand(files: &[PathBuf]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for f in files {
        if f.is_dir() {
            let mut inner: Vec<PathBuf> = std::fs::read_dir(f)
                .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
                .unwrap_or_default();
            inner.retain(|p| {
                let s = p.to_string_lossy();
                s.ends_with(".jsonl") || s.ends_with(".jsonl.gz")
            });
            inner.sort();
            out.extend(inner);
        } else {
            out.push(f.clone());
        }
    }
    out
}

/// Exit status over several files: bad input wins, then failures.
fn worst(a: u8, b: u8) -> u8 {
    if a == EXIT_BAD_INPUT || b == EXIT_BAD_INPUT {
        EXIT_BAD_INPUT
    } else {
        a.max(b)
    }
}

/// Read every trace of `files` (folders expanded) and hand each to `check`,
/// which prints its verdict and returns an exit status; bad input wins.
fn for_each_trace(
    files: &[PathBuf],
    mut check: impl FnMut(&std::path::Path, &TraceCase) -> u8,
) -> u8 {
    if files.is_empty() {
        eprintln!(
            "error: no trace given: name .jsonl or .jsonl.gz trace files, or folders of them"
        );
        return EXIT_BAD_INPUT;
    }
    let given: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
    let files = expand(files);
    if files.is_empty() {
        eprintln!(
            "error: {}: no *.jsonl or *.jsonl.gz trace files in this folder",
            given.join(", ")
        );
        return EXIT_BAD_INPUT;
    }
    let mut code = EXIT_OK;
    for f in &files {
        match TraceCase::read(f) {
            Ok(case) => code = worst(code, check(f, &case)),
            // The error names the file (and line) already.
            Err(e) => {
                eprintln!("error: {e}");
                code = worst(code, EXIT_BAD_INPUT);
            }
        }
    }
    code
}

/// Rebuild each trace with kvgeom's connector under the chosen variant and
/// compare lists, transfers and rewritten ids with what vLLM did.
pub fn diff_trace(files: &[PathBuf], variant: &VariantArgs) -> u8 {
    let policy = match variant.variant() {
        Ok(v) => v.policy(),
        Err(code) => return code,
    };
    let (mut matched, mut differ) = (0, 0);
    let code = for_each_trace(files, |f, case| {
        match diff_against_connector(case, policy) {
            Ok(report) if report.is_match() => {
                matched += 1;
                println!("{}: MATCH", f.display());
                EXIT_OK
            }
            Ok(report) => {
                differ += 1;
                println!("{}: {report}", f.display());
                EXIT_FAILED
            }
            Err(e) => {
                eprintln!("error: {}: {e}", f.display());
                EXIT_BAD_INPUT
            }
        }
    });
    if code != EXIT_BAD_INPUT || matched + differ > 0 {
        println!("\n{matched} match, {differ} differ");
    }
    code
}

pub fn check_trace(files: &[PathBuf]) -> u8 {
    let (mut clean, mut broken) = (0, 0);
    let code = for_each_trace(files, |f, case| match check_case(case) {
        Ok(r) => {
            if r.violations.is_empty() {
                clean += 1;
                println!("{}: OK", f.display());
            } else {
                broken += 1;
                println!("{}: {} violations", f.display(), r.violations.len());
                for x in r.violations.iter().take(10) {
                    println!("  {x}");
                }
            }
            for note in &r.notes {
                println!("  note: {note}");
            }
            if r.violations.is_empty() {
                EXIT_OK
            } else {
                EXIT_FAILED
            }
        }
        Err(e) => {
            eprintln!("error: {}: {e}", f.display());
            EXIT_BAD_INPUT
        }
    });
    if code != EXIT_BAD_INPUT || clean + broken > 0 {
        println!("\n{clean} passed, {broken} failed");
    }
    code
}
