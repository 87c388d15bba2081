//! The commands' standard output. A reader that goes away before the end
//! (`kvgeom check-trace DIR | head -1`) ends the command quietly with the
//! status a shell gives a process its pipe closed (141), never a panic;
//! any other write error is reported on stderr and ends it with status 2.

use std::io::Write;

/// The status a process ended by a closed pipe gets from a shell (128 + SIGPIPE).
pub(crate) const EXIT_CLOSED_PIPE: i32 = 141;

/// Write `args` to standard output (what `out!` and `outln!` expand to).
pub(crate) fn write_stdout(args: std::fmt::Arguments<'_>) {
    let mut stdout = std::io::stdout().lock();
    let written = stdout.write_fmt(args).and_then(|()| stdout.flush());
    match written {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
            std::process::exit(EXIT_CLOSED_PIPE)
        }
        Err(e) => {
            eprintln!("error: cannot write to standard output: {e}");
            std::process::exit(i32::from(super::EXIT_BAD_INPUT))
        }
    }
}

/// Print a JSON value on stdout, pretty, with a newline; `Err` is exit 2
/// after saying why it could not be written as JSON.
pub(crate) fn print_json_value(report: &serde_json::Value) -> Result<(), u8> {
    match serde_json::to_string_pretty(report) {
        Ok(text) => {
            outln!("{text}");
            Ok(())
        }
        Err(e) => {
            eprintln!("error: {e}");
            Err(super::EXIT_BAD_INPUT)
        }
    }
}
