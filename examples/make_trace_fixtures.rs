//! Writes the project's trace fixtures: for every `*.jsonl` / `*.jsonl.gz`
//! trace in SRC, `DST/<name>.jsonl.gz` without the fields the reader
//! rebuilds. Usage: `cargo run --example make_trace_fixtures -- SRC DST`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use kvgeom::trace::write_fixture;

fn traces_in(dir: &Path) -> std::io::Result<Vec<(PathBuf, String)>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let Some(file) = path.file_name().and_then(|f| f.to_str()) else {
            continue;
        };
        let stem = file
            .strip_suffix(".jsonl.gz")
            .or_else(|| file.strip_suffix(".jsonl"));
        if let Some(stem) = stem {
            let stem = stem.to_string();
            out.push((path, stem));
        }
    }
    out.sort();
    Ok(out)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [src, dst] = args.as_slice() else {
        eprintln!("usage: make_trace_fixtures SRC DST");
        return ExitCode::from(2);
    };
    let (src, dst) = (Path::new(src), Path::new(dst));
    let traces = match traces_in(src) {
        Ok(t) if !t.is_empty() => t,
        Ok(_) => {
            eprintln!("{}: no *.jsonl or *.jsonl.gz traces", src.display());
            return ExitCode::FAILURE;
        }
        Err(e) => {
            eprintln!("{}: {e}", src.display());
            return ExitCode::FAILURE;
        }
    };
    let (mut source_total, mut fixture_total) = (0, 0);
    for (path, stem) in &traces {
        let out = dst.join(format!("{stem}.jsonl.gz"));
        match write_fixture(path, &out) {
            Ok(stats) => {
                source_total += stats.source_bytes;
                fixture_total += stats.fixture_bytes;
            }
            Err(e) => {
                eprintln!("{e}");
                return ExitCode::FAILURE;
            }
        }
    }
    println!(
        "{} fixtures in {}: {} bytes (sources: {} bytes)",
        traces.len(),
        dst.display(),
        fixture_total,
        source_total
    );
    ExitCode::SUCCESS
}
