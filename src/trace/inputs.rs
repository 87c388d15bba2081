//! Which trace files a command line names: a file as given, a folder's
//! `*.jsonl` and `*.jsonl.gz` (v1) and `*.trace.json` and `*.trace.json.gz`
//! (v2) files at any depth, in sorted order. Each
//! folder is entered once (by its canonical path), so links that loop back
//! or lead to a folder already searched never repeat or hang the walk.

use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};

use super::error::{TraceError, TraceErrorKind};

/// Whether `path` names a trace file (`*.jsonl`, `*.jsonl.gz`,
/// `*.trace.json` or `*.trace.json.gz`).
pub fn is_trace_name(path: &Path) -> bool {
    is_v1_name(path)
        || path
            .file_name()
            .map(|n| n.to_string_lossy())
            .is_some_and(|n| n.ends_with(".trace.json") || n.ends_with(".trace.json.gz"))
}

/// Whether `path` names a v1 trace (`*.jsonl` or `*.jsonl.gz`); any other
/// file given is read as a v2 trace.
pub fn is_v1_name(path: &Path) -> bool {
    path.file_name()
        .map(|n| n.to_string_lossy())
        .is_some_and(|n| n.ends_with(".jsonl") || n.ends_with(".jsonl.gz"))
}

/// The trace files of `paths`, in order: a file as given, a folder
/// searched recursively (each folder's entries sorted by name, subfolders
/// entered where they sort). A folder that cannot be read, or one holding
/// no trace file at any depth, is an error in its place; the other inputs
/// are still listed.
pub fn trace_inputs(paths: &[PathBuf]) -> Vec<Result<PathBuf, TraceError>> {
    let mut out = Vec::new();
    let mut visited = HashSet::new();
    for path in paths {
        if !path.is_dir() {
            out.push(Ok(path.clone()));
            continue;
        }
        let before = out.len();
        walk(path, &mut visited, &mut out);
        if out.len() == before {
            out.push(Err(TraceError::new(
                path,
                None,
                TraceErrorKind::EmptyFolder,
            )));
        }
    }
    out
}

fn walk(dir: &Path, visited: &mut HashSet<PathBuf>, out: &mut Vec<Result<PathBuf, TraceError>>) {
    let read = |source| TraceError::new(dir, None, TraceErrorKind::Read(source));
    match fs::canonicalize(dir) {
        Ok(real) => {
            if !visited.insert(real) {
                return;
            }
        }
        Err(e) => return out.push(Err(read(e))),
    }
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) => return out.push(Err(read(e))),
    };
    let mut paths = Vec::new();
    for entry in entries {
        match entry {
            Ok(entry) => paths.push(entry.path()),
            Err(e) => out.push(Err(read(e))),
        }
    }
    paths.sort_by(|a, b| a.file_name().cmp(&b.file_name()));
    for path in paths {
        if path.is_dir() {
            walk(&path, visited, out);
        } else if is_trace_name(&path) {
            // A trace name that is not a readable file (a dangling link, a
            // FIFO) is listed, so that reading it reports it by name.
            out.push(Ok(path));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folders_are_searched_recursively_in_sorted_order() {
        let dir = std::env::temp_dir().join(format!("kvgeom-trace-inputs-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("b/deeper")).unwrap();
        fs::create_dir_all(dir.join("empty")).unwrap();
        for f in [
            "c.jsonl",
            "a.jsonl.gz",
            "b/deeper/x.jsonl",
            "b/y.jsonl",
            "b/z.trace.json.gz",
            "b/result.json",
            "notes.txt",
        ] {
            fs::write(dir.join(f), b"").unwrap();
        }
        let found: Vec<PathBuf> = trace_inputs(std::slice::from_ref(&dir))
            .into_iter()
            .map(Result::unwrap)
            .collect();
        let names: Vec<String> = found
            .iter()
            .map(|p| p.strip_prefix(&dir).unwrap().display().to_string())
            .collect();
        assert_eq!(
            names,
            [
                "a.jsonl.gz",
                "b/deeper/x.jsonl",
                "b/y.jsonl",
                "b/z.trace.json.gz",
                "c.jsonl"
            ]
        );
        let empty = trace_inputs(&[dir.join("empty")]);
        assert_eq!(empty.len(), 1);
        let err = empty.into_iter().next().unwrap().unwrap_err();
        assert!(matches!(err.kind, TraceErrorKind::EmptyFolder), "{err}");
        assert!(err.to_string().contains("empty"), "{err}");
        let _ = fs::remove_dir_all(&dir);
    }
}
