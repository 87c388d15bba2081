//! Shrinking failures of `--connector sglang` to minimal replays: the
//! batched search the vLLM connector uses (`sweep::batch_shrink`: the
//! smallest prompt length that fails the same way), every candidate of every
//! failure run by SGLang's own transfer in one driver batch.

use crate::scenario::CaseReport;
use crate::sglang::connector::run_sweep;
use crate::sglang::python::SglangPython;

/// At most this many failures are shrunk (one per geometry and outcome).
const SHRUNK_AT_MOST: usize = 5;

/// The failures worth shrinking: the first of each (geometry, outcome).
fn distinct_failures(reports: &[CaseReport]) -> Vec<&CaseReport> {
    let mut shown: Vec<(String, String)> = Vec::new();
    let mut out = Vec::new();
    for r in reports.iter().filter(|r| !r.passed()) {
        let key = (
            r.case.geometry_name().to_string(),
            r.outcome.label().to_string(),
        );
        if shown.contains(&key) || shown.len() >= SHRUNK_AT_MOST {
            continue;
        }
        shown.push(key);
        out.push(r);
    }
    out
}

/// The replay of `case` on the interpreter that ran it (the flag is left
/// out for the project's venv).
fn replay(case: &crate::scenario::Case, python: &SglangPython) -> String {
    let default = crate::driver::project_root()
        .join(".sglang-venv")
        .join("bin")
        .join("python");
    // The venv's folder, not the interpreter: a venv's python is a link to
    // the base interpreter, which every venv shares.
    let key = |p: &std::path::Path| {
        let dir = p.parent().and_then(|d| d.canonicalize().ok());
        (dir, p.file_name().map(|n| n.to_owned()))
    };
    let same = |a: &std::path::Path, b: &std::path::Path| key(a) == key(b);
    let flag = if same(&python.python, &default)
        || std::env::var_os(crate::sglang::python::ENV).is_some()
    {
        String::new()
    } else {
        format!(" --sglang-python {}", python.python.display())
    };
    format!("{}{flag}", case.replay_command())
}

/// Prints `minimal replays:` on stderr for the first failures, each shrunk
/// to the smallest prompt that fails the same way (unless `no_shrink`).
pub(crate) fn print_minimal_replays(
    reports: &[CaseReport],
    python: &SglangPython,
    no_shrink: bool,
) {
    let failures = distinct_failures(reports);
    if failures.is_empty() {
        return;
    }
    let minimal = if no_shrink {
        failures.iter().map(|r| r.case.clone()).collect()
    } else {
        match crate::sweep::batch_shrink::shrink_batched(&failures, |cases| {
            run_sweep(cases, python).map(|tried| tried.into_iter().map(|j| j.report).collect())
        }) {
            Ok(m) => m,
            Err(e) => {
                eprintln!("note: shrinking failed ({e}); replays are of the cases as run");
                failures.iter().map(|r| r.case.clone()).collect()
            }
        }
    };
    eprintln!("\nminimal replays:");
    for (r, m) in failures.iter().zip(&minimal) {
        eprintln!(
            "- {} N={}: {}",
            r.case.geometry_name(),
            r.case.prompt_len,
            r.outcome.describe()
        );
        eprintln!("  replay: {}", replay(m, python));
    }
}
