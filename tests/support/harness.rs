//! A small stand-in for libtest, for the test files that need their own
//! `main` (`harness = false`): cases run one after another on the main
//! thread, plain arguments select cases by substring as with libtest
//! (flags such as `--nocapture` change nothing; `--skip NAME` leaves out
//! the cases whose names contain NAME), and a case may report
//! itself skipped with its reason. The last line is the tally
//! `N passed, N failed, N skipped`, which `.ci/run` reads.

use std::process::ExitCode;

/// How one case ended.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub enum Verdict {
    Passed,
    Failed(String),
    Skipped(String),
}

/// One named case, run when the command line selects it.
pub type NamedCase<'a> = (String, Box<dyn FnOnce() -> Verdict + 'a>);

/// Run the selected cases in order, print a line for each and the tally;
/// fail when any case failed.
pub fn run(cases: Vec<NamedCase<'_>>) -> ExitCode {
    let (filters, skips) = selection(std::env::args().skip(1));
    let (mut passed, mut failed, mut skipped) = (0, 0, 0);
    for (name, case) in cases {
        if !filters.is_empty() && !filters.iter().any(|f| name.contains(f.as_str())) {
            continue;
        }
        if skips.iter().any(|f| name.contains(f.as_str())) {
            continue;
        }
        match case() {
            Verdict::Passed => {
                passed += 1;
                println!("test {name} ... ok");
            }
            Verdict::Failed(why) => {
                failed += 1;
                println!("test {name} ... FAILED: {why}");
            }
            Verdict::Skipped(why) => {
                skipped += 1;
                println!("test {name} ... skipped: {why}");
            }
        }
    }
    println!("{passed} passed, {failed} failed, {skipped} skipped");
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The name filters and the `--skip` filters of a command line.
fn selection(args: impl Iterator<Item = String>) -> (Vec<String>, Vec<String>) {
    let (mut filters, mut skips) = (Vec::new(), Vec::new());
    let mut args = args.peekable();
    while let Some(arg) = args.next() {
        if arg == "--skip" {
            skips.extend(args.next());
        } else if let Some(name) = arg.strip_prefix("--skip=") {
            skips.push(name.to_string());
        } else if !arg.starts_with('-') {
            filters.push(arg);
        }
    }
    (filters, skips)
}
