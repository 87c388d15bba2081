//! The layer table of docs/architecture.md, checked against `src/`.
//!
//! Every top-level module of `src/` has a rank in `LAYERS`, with the reason
//! it sits there; an import must point to a module of strictly lower rank
//! (`memory` and `geometry` are leaves, `nixl` sits on them, the `connector`
//! on `nixl`, the harness modules on the connector, each on the ones it
//! uses). A failure names the file, the line, both modules and their ranks.
//! Imports still being removed are listed in `PENDING`, and modules planned
//! but not yet written in `PLANNED`; each entry fails the test once it is no
//! longer needed. Inside a module, no two files may import each other in a
//! cycle, and the curated modules (`CURATED`: `live`, `derive`) declare no
//! `pub mod`: their API is re-exported from the module root.
//!
//! The checker reads the source text: `use` trees (grouped ones included),
//! inline `crate::module::` paths and relative `super::`/`self::` paths, in
//! code and in `#[cfg(test)]` code alike (comments and string literals are
//! skipped). `lib.rs` and the binary's `main.rs` stand above the table.
//!
//! The same lexer checks one rule of the code itself: no file under `src/`
//! writes `Result<_, String>` (nor a `&str` or `Box<dyn Error>` error);
//! errors are typed, and become text where they are printed.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt::Write as _;
use std::path::Path;

/// One row of the layer table: a top-level module of `src/`, its rank and
/// why it sits there. An import must point to a module of strictly lower
/// rank; modules of one rank never import each other.
struct Row {
    module: &'static str,
    rank: u8,
    /// Why the module sits at this rank: what it imports that forces it
    /// above the rank below, or who imports it.
    why: &'static str,
}

const fn row(module: &'static str, rank: u8, why: &'static str) -> Row {
    Row { module, rank, why }
}

/// Every top-level module of `src/`, bottom first. A new module gets a row
/// here and a place in the diagram of docs/architecture.md.
const LAYERS: &[Row] = &[
    // base
    row("limits", 0, "every input limit; imports no kvgeom module"),
    row(
        "time_limits",
        0,
        "every time limit on a wait; imports no kvgeom module",
    ),
    // leaves
    row(
        "memory",
        1,
        "KV backing memory; below nixl, which registers it",
    ),
    row(
        "geometry",
        1,
        "the input model; reads files within `limits`",
    ),
    // nixl
    row(
        "nixl",
        2,
        "the Nixl trait and its transports, over `memory`",
    ),
    // the system under test
    row(
        "connector",
        3,
        "vLLM's connector reproduced, over `nixl`; knows no harness type",
    ),
    // harness
    row(
        "layout",
        4,
        "the harness's model of memory, from `geometry` and `nixl` regions",
    ),
    row(
        "scheduler",
        4,
        "vLLM's scheduler model, from `geometry` alone",
    ),
    row(
        "defects",
        4,
        "the defect table: each row selects a `connector::Policy` decision",
    ),
    row(
        "derive",
        4,
        "geometries from HF configs, from `geometry` alone; low so that everything \
         loading geometry files (sweep, bench, live) may use `load_geometry_file`",
    ),
    row("pattern", 5, "the provenance pattern over `layout`"),
    row(
        "variant",
        5,
        "what a case runs: a named policy or one row of `defects`, so above `defects`",
    ),
    row("oracle", 6, "the invariants, over `pattern` and `layout`"),
    row(
        "scenario",
        7,
        "one case end to end: `oracle`, `variant`, `scheduler`, the connector",
    ),
    row(
        "under_test",
        8,
        "the connector-under-test interface, the neutral run record, the one judge and the \
         expectations, over `scenario` (kvgeom's own connector); it knows no driver protocol: \
         `live`, `trace` and `sglang` rank above it and convert their drivers' logs into its \
         record",
    ),
    row(
        "driver",
        8,
        "the room every stack's Python driver shares (bounded runs, the ending classified, \
         scratch folders, NIXL choice, trace names): cases and memory limits from `scenario`, \
         below `live` and `sglang`, which drive vLLM's and SGLang's code through it",
    ),
    row(
        "live",
        9,
        "vLLM's Python connector driven over `scenario`'s prepared memory through `driver`, as \
         a connector under test whose driver results it converts into `under_test`'s record",
    ),
    row(
        "trace",
        10,
        "vLLM traces replayed through the connector and compared with `scenario`'s run; \
         recorded v2/v3 run traces read as a connector under test, their driver results \
         converted with `live`'s reading (so above `live`)",
    ),
    row(
        "sweep",
        11,
        "case enumeration, runs and shrinking over any connector under test; loads \
         geometry files through `derive`",
    ),
    row(
        "sglang",
        11,
        "SGLang's own P/D transfer judged: its pools modelled from `geometry`, its driver run, \
         its oracles over `oracle`'s violations; beside `sweep`, below `cli`",
    ),
    row(
        "lifecycle",
        11,
        "many requests on one P/D pair's shared pools: scenarios, kvgeom's connector behind \
         its seam, the whole-scenario oracles; loads nothing itself, run by `cli`, `bench` and \
         the fuzz target; beside `sweep`, above `under_test`, whose pipeline it is to join",
    ),
    row(
        "report",
        12,
        "reports of a sweep: each carries the `sweep::shard::Shard` it ran, so above `sweep`",
    ),
    row(
        "bench",
        12,
        "benchmarks; `bench scale` enumerates its cases with `sweep::plan`, so above `sweep`",
    ),
    row(
        "generate",
        12,
        "the fuzz and proptest generator: its targets drive `trace`, `scenario` and the \
         connector",
    ),
    row("cli", 13, "the subcommands: everything below"),
];

/// Modules with a row but no folder or file under `src/` yet; the test
/// fails once one exists, so that its entry here is deleted.
const PLANNED: &[&str] = &[];

/// Imports that break the ranks and are being removed; each is allowed until
/// it is gone, and the test fails once it is gone, so that its entry here
/// is deleted. (importer, imported, why it is still there)
const PENDING: &[(&str, &str, &str)] = &[];

fn row_of(module: &str) -> Option<&'static Row> {
    LAYERS.iter().find(|r| r.module == module)
}

/// Top-level modules whose submodules stay `pub(crate)`: their API is
/// re-exported from the module root (and the little the tests need beyond
/// it from `kvgeom::internals`).
const CURATED: &[&str] = &["live", "derive"];

// ---------------------------------------------------------------------------
// Lexing: identifiers, `::` and single punctuation characters, with lines.

#[derive(Clone, Debug, PartialEq, Eq)]
struct Token {
    text: String,
    line: usize,
}

fn lex(src: &str) -> Vec<Token> {
    let chars: Vec<char> = src.chars().collect();
    let mut tokens = Vec::new();
    let mut line = 1;
    let mut i = 0;
    let at = |k: usize| chars.get(k).copied().unwrap_or('\0');
    while i < chars.len() {
        let c = chars[i];
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c == '/' && at(i + 1) == '/' {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if chars[i] == '\n' {
                        line += 1;
                    }
                    i += 1;
                }
            }
        } else if let Some(hashes) = raw_string_start(&chars, i) {
            // r"..", r#".."#, br#".."#: skip to the quote followed by the hashes.
            i += chars[i..].iter().position(|&c| c == '"').unwrap_or(0) + 1;
            while i < chars.len() {
                if chars[i] == '"' && (1..=hashes).all(|h| at(i + h) == '#') {
                    i += 1 + hashes;
                    break;
                }
                if chars[i] == '\n' {
                    line += 1;
                }
                i += 1;
            }
        } else if c == '"' || (c == 'b' && at(i + 1) == '"') {
            i += if c == 'b' { 2 } else { 1 };
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    i += 1;
                }
                if at(i) == '\n' {
                    line += 1;
                }
                i += 1;
            }
            i += 1;
        } else if c == '\'' {
            // A char literal ('x', '\n', '\u{..}') or a lifetime ('a).
            if at(i + 1) == '\\' {
                // Quote, backslash, the escaped character, then up to the quote.
                i += 3;
                while i < chars.len() && chars[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if at(i + 2) == '\'' {
                i += 3;
            } else {
                i += 1;
            }
        } else if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            let mut text: String = chars[start..i].iter().collect();
            if text == "r" && at(i) == '#' && (at(i + 1).is_alphabetic() || at(i + 1) == '_') {
                // A raw identifier r#name.
                let start = i + 1;
                i = start;
                while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                    i += 1;
                }
                text = chars[start..i].iter().collect();
            }
            tokens.push(Token { text, line });
        } else if c == ':' && at(i + 1) == ':' {
            tokens.push(Token {
                text: "::".into(),
                line,
            });
            i += 2;
        } else {
            tokens.push(Token {
                text: c.to_string(),
                line,
            });
            i += 1;
        }
    }
    tokens
}

/// The number of `#`s if a raw string literal starts at `i`.
fn raw_string_start(chars: &[char], i: usize) -> Option<usize> {
    let prev_is_ident = i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_');
    if prev_is_ident {
        return None;
    }
    let mut k = i;
    if chars.get(k) == Some(&'b') {
        k += 1;
    }
    if chars.get(k) != Some(&'r') {
        return None;
    }
    k += 1;
    let mut hashes = 0;
    while chars.get(k) == Some(&'#') {
        hashes += 1;
        k += 1;
    }
    (chars.get(k) == Some(&'"')).then_some(hashes)
}

// ---------------------------------------------------------------------------
// Paths: use trees and inline paths, expanded to one path per leaf.

/// One path as written (`crate`, `super`, `self` or a bare first segment),
/// the name it binds (its alias, or its last segment) and its line.
#[derive(Clone, Debug)]
struct WrittenPath {
    segments: Vec<String>,
    name: String,
    line: usize,
}

fn is_ident(t: &str) -> bool {
    t.chars()
        .next()
        .is_some_and(|c| c.is_alphabetic() || c == '_')
}

/// Parse the use tree (or path) starting at `i`; returns its leaves and the
/// index after it.
fn parse_tree(
    tokens: &[Token],
    mut i: usize,
    prefix: &[String],
    out: &mut Vec<WrittenPath>,
) -> usize {
    let mut segments = prefix.to_vec();
    let mut line = tokens.get(i).map_or(0, |t| t.line);
    while let Some(t) = tokens.get(i) {
        if t.text == "{" {
            i += 1;
            while tokens.get(i).is_some_and(|t| t.text != "}") {
                if tokens[i].text == "," {
                    i += 1;
                    continue;
                }
                let before = i;
                i = parse_tree(tokens, i, &segments, out);
                if i == before {
                    i += 1;
                }
            }
            return i + 1;
        }
        if t.text == "*" {
            out.push(WrittenPath {
                name: "*".into(),
                segments: segments.clone(),
                line: t.line,
            });
            return i + 1;
        }
        if !is_ident(&t.text) {
            break;
        }
        if segments.len() == prefix.len() {
            line = t.line;
        }
        // `{self, ..}` inside a group names the prefix itself.
        let names_prefix = t.text == "self" && !prefix.is_empty() && segments.len() == prefix.len();
        if !names_prefix {
            segments.push(t.text.clone());
        }
        i += 1;
        if tokens.get(i).is_some_and(|t| t.text == "::") {
            i += 1;
            continue;
        }
        break;
    }
    let mut name = segments.last().cloned().unwrap_or_default();
    if tokens.get(i).is_some_and(|t| t.text == "as") {
        if let Some(alias) = tokens.get(i + 1) {
            name = alias.text.clone();
        }
        i += 2;
    }
    if !segments.is_empty() {
        out.push(WrittenPath {
            segments,
            name,
            line,
        });
    }
    i
}

/// Where one file sits: `src/scenario/vram.rs` is `["scenario", "vram"]`,
/// `src/scenario/mod.rs` is `["scenario"]`, `src/pattern.rs` is `["pattern"]`.
fn module_path(file: &str) -> Vec<String> {
    let rel = file.trim_start_matches("src/").trim_end_matches(".rs");
    let mut parts: Vec<String> = rel.split('/').map(str::to_string).collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts
}

/// An import of one file, resolved to an absolute path below the crate root.
#[derive(Clone, Debug)]
struct Import {
    target: Vec<String>,
    /// The name it binds (for `pub use` re-exports in `mod.rs` files).
    name: String,
    line: usize,
    /// A `use` item with a bare first segment (relative to its module in
    /// 2018+ editions, e.g. `pub use cuda::DeviceArena` in `mod.rs`).
    bare: bool,
}

/// Every crate-internal path of one file, resolved against its module.
fn imports(file: &str, src: &str) -> Vec<Import> {
    let tokens = lex(src);
    let file_module = module_path(file);
    // Inline `mod name { .. }` blocks the scan is inside, with their depth.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut found = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        let t = &tokens[i].text;
        let prev = i.checked_sub(1).map(|k| tokens[k].text.as_str());
        let next = tokens.get(i + 1).map(|t| t.text.as_str());
        if t == "mod" && tokens.get(i + 2).is_some_and(|t| t.text == "{") {
            inline.push((tokens[i + 1].text.clone(), depth));
            depth += 1;
            i += 3;
            continue;
        }
        if t == "{" {
            depth += 1;
        } else if t == "}" {
            depth = depth.saturating_sub(1);
            if inline.last().is_some_and(|(_, d)| *d == depth) {
                inline.pop();
            }
        }
        let use_item = t == "use";
        let path_start = matches!(t.as_str(), "crate" | "super" | "self")
            && next == Some("::")
            && prev != Some("::")
            && prev != Some("$");
        if !use_item && !path_start {
            i += 1;
            continue;
        }
        let mut here = file_module.clone();
        here.extend(inline.iter().map(|(m, _)| m.clone()));
        let mut written = Vec::new();
        i = parse_tree(&tokens, if use_item { i + 1 } else { i }, &[], &mut written);
        for w in written {
            if let Some((target, bare)) = resolve(&here, &w.segments) {
                found.push(Import {
                    target,
                    name: w.name,
                    line: w.line,
                    bare,
                });
            }
        }
    }
    found
}

/// `segments` as an absolute path below the crate root, if it is one.
fn resolve(here: &[String], segments: &[String]) -> Option<(Vec<String>, bool)> {
    let first = segments.first()?;
    match first.as_str() {
        "crate" => Some((segments[1..].to_vec(), false)),
        "self" => {
            let mut p = here.to_vec();
            p.extend_from_slice(&segments[1..]);
            Some((p, false))
        }
        "super" => {
            let mut p = here.to_vec();
            let mut rest = segments;
            while rest.first().is_some_and(|s| s == "super") {
                p.pop()?;
                rest = &rest[1..];
            }
            p.extend_from_slice(rest);
            Some((p, false))
        }
        _ => {
            let mut p = here.to_vec();
            p.extend_from_slice(segments);
            Some((p, true))
        }
    }
}

// ---------------------------------------------------------------------------
// The rules.

/// An import that names its file and line.
#[derive(Clone, Debug)]
struct Evidence {
    file: String,
    line: usize,
}

impl std::fmt::Display for Evidence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.file, self.line)
    }
}

/// Directed edges with the first import that makes each one.
type Graph = BTreeMap<String, BTreeMap<String, Evidence>>;

/// Check `files` (path below the repository root, source text) against the
/// layer table; returns one message per broken rule.
fn check(files: &[(String, String)]) -> Vec<String> {
    let mut problems = Vec::new();
    let mut modules: Graph = BTreeMap::new();
    // Per directory module: file-to-file edges.
    let mut file_graphs: BTreeMap<String, Graph> = BTreeMap::new();

    // File stems of each directory module, and the names its `mod.rs`
    // re-exports from them.
    let mut stems: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut reexports: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for (file, src) in files {
        let path = module_path(file);
        if path.len() == 2 {
            stems
                .entry(path[0].clone())
                .or_default()
                .insert(path[1].clone());
        }
        if file.ends_with("/mod.rs") && path.len() == 1 {
            for import in imports(file, src) {
                if import.target.len() >= 3 && import.target[0] == path[0] {
                    reexports
                        .entry(path[0].clone())
                        .or_default()
                        .insert(import.name.clone(), import.target[1].clone());
                }
            }
        }
    }

    for (file, src) in files {
        let path = module_path(file);
        let Some(module) = path.first().cloned() else {
            continue; // lib.rs
        };
        if module == "main" || module == "lib" {
            continue;
        }
        let Some(row) = row_of(&module) else {
            problems.push(format!(
                "{file}:1: module `{module}` is not in the layer table \
                 (tests/project/architecture.rs LAYERS, docs/architecture.md)"
            ));
            continue;
        };
        for import in imports(file, src) {
            let Some(target) = import.target.first() else {
                continue;
            };
            let evidence = Evidence {
                file: file.clone(),
                line: import.line,
            };
            if *target == module {
                // Inside one module: a file-to-file edge, unless through mod.rs.
                if path.len() == 2 && !import.bare {
                    let sibling = import.target.get(1).and_then(|s| {
                        let own = stems.get(&module)?;
                        if own.contains(s) {
                            Some(s.clone())
                        } else {
                            reexports.get(&module)?.get(s).cloned()
                        }
                    });
                    if let Some(sibling) = sibling.filter(|s| *s != path[1]) {
                        file_graphs
                            .entry(module.clone())
                            .or_default()
                            .entry(path[1].clone())
                            .or_default()
                            .entry(sibling)
                            .or_insert(evidence);
                    }
                }
                continue;
            }
            if import.bare {
                continue; // an external crate (std, serde, ...)
            }
            let Some(target_row) = row_of(target) else {
                problems.push(format!(
                    "{evidence}: `{module}` imports `{target}`, which is not in the layer table"
                ));
                continue;
            };
            let pending = PENDING
                .iter()
                .any(|(from, to, _)| *from == module.as_str() && *to == target.as_str());
            if target_row.rank >= row.rank && !pending {
                problems.push(format!(
                    "{evidence}: `{module}` (rank {}) imports `{target}` (rank {}): \
                     an import must point to a strictly lower rank \
                     (tests/project/architecture.rs LAYERS)",
                    row.rank, target_row.rank
                ));
            }
            modules
                .entry(module.clone())
                .or_default()
                .entry(target.clone())
                .or_insert(evidence);
        }
    }

    for (file, src) in files {
        problems.extend(public_submodules(file, src));
    }

    for cycle in cycles(&modules) {
        problems.push(format!(
            "{}: import cycle between modules: {} (modules must not import each other in a cycle)",
            cycle.0, cycle.1
        ));
    }
    for (module, graph) in &file_graphs {
        for cycle in cycles(graph) {
            problems.push(format!(
                "{}: import cycle between files of `{module}`: {} \
                 (files of one module must not import each other in a cycle)",
                cycle.0, cycle.1
            ));
        }
    }
    let mut reported = BTreeSet::new();
    problems.retain(|p| reported.insert(p.clone()));
    problems
}

/// The `PENDING` allowances no file of `files` needs any more.
fn stale_pending(files: &[(String, String)]) -> Vec<String> {
    PENDING
        .iter()
        .filter(|(from, to, _)| {
            !files.iter().any(|(file, src)| {
                module_path(file).first().map(String::as_str) == Some(*from)
                    && imports(file, src)
                        .iter()
                        .any(|i| !i.bare && i.target.first().map(String::as_str) == Some(*to))
            })
        })
        .map(|(from, to, _)| {
            format!(
                "tests/project/architecture.rs: no import of `{to}` in `{from}` any more: \
                 delete its PENDING allowance"
            )
        })
        .collect()
}

/// `pub mod` items in the files of a curated module (`CURATED`): their
/// submodules are `pub(crate)`, the API is re-exported from the root.
fn public_submodules(file: &str, src: &str) -> Vec<String> {
    let path = module_path(file);
    let Some(module) = path.first().filter(|m| CURATED.contains(&m.as_str())) else {
        return Vec::new();
    };
    let tokens = lex(src);
    tokens
        .windows(3)
        .filter(|w| w[0].text == "pub" && w[1].text == "mod" && is_ident(&w[2].text))
        .map(|w| {
            format!(
                "{file}:{}: `pub mod {}` below the root of `{module}`: make it `pub(crate)` and \
                 re-export what the API needs from src/{module}/mod.rs, as `connector` does",
                w[0].line, w[2].text
            )
        })
        .collect()
}

/// One entry per cycle (the set of its nodes, reported once): the evidence
/// of its first edge and the cycle spelled out with the evidence of each edge.
fn cycles(graph: &Graph) -> Vec<(Evidence, String)> {
    let mut seen: BTreeSet<BTreeSet<String>> = BTreeSet::new();
    let mut found = Vec::new();
    for (from, targets) in graph {
        for (to, evidence) in targets {
            let Some(back) = shortest_path(graph, to, from) else {
                continue;
            };
            let nodes: BTreeSet<String> = back.iter().cloned().collect();
            if !seen.insert(nodes) {
                continue;
            }
            let mut text = format!("`{from}` → `{to}` ({evidence})");
            for pair in back.windows(2) {
                let _ = write!(text, " → `{}` ({})", pair[1], graph[&pair[0]][&pair[1]]);
            }
            found.push((evidence.clone(), text));
        }
    }
    found
}

/// Nodes from `from` to `to` (both included), by breadth-first search.
fn shortest_path(graph: &Graph, from: &str, to: &str) -> Option<Vec<String>> {
    let mut parent: BTreeMap<String, String> = BTreeMap::new();
    let mut queue = VecDeque::from([from.to_string()]);
    let mut visited = BTreeSet::from([from.to_string()]);
    while let Some(node) = queue.pop_front() {
        if node == to {
            let mut path = vec![node.clone()];
            let mut at = node;
            while let Some(p) = parent.get(&at) {
                path.push(p.clone());
                at = p.clone();
            }
            path.reverse();
            return Some(path);
        }
        for next in graph.get(&node).into_iter().flat_map(|t| t.keys()) {
            if visited.insert(next.clone()) {
                parent.insert(next.clone(), node.clone());
                queue.push_back(next.clone());
            }
        }
    }
    None
}

/// Every `.rs` file under `src/`, as `(src/..., text)`, in path order.
fn source_files() -> Vec<(String, String)> {
    fn walk(dir: &Path, root: &Path, out: &mut Vec<(String, String)>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .expect("read src/")
            .map(|e| e.expect("dir entry").path())
            .collect();
        entries.sort();
        for path in entries {
            if path.is_dir() {
                walk(&path, root, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path.strip_prefix(root).expect("below the root");
                let text = std::fs::read_to_string(&path).expect("read a source file");
                out.push((rel.to_string_lossy().replace('\\', "/"), text));
            }
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    walk(&root.join("src"), root, &mut files);
    files
}

#[test]
fn src_follows_the_layer_table() {
    let files = source_files();
    assert!(
        files.len() > 50,
        "found only {} files under src/",
        files.len()
    );
    let mut problems = check(&files);
    problems.extend(stale_pending(&files));
    assert!(
        problems.is_empty(),
        "{} import(s) break the layer table (docs/architecture.md):\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn every_module_of_src_is_in_the_layer_table() {
    let modules: BTreeSet<String> = source_files()
        .iter()
        .filter_map(|(file, _)| module_path(file).first().cloned())
        .filter(|m| m != "main" && m != "lib")
        .collect();
    for module in &modules {
        assert!(
            row_of(module).is_some(),
            "src module `{module}` has no row in LAYERS (tests/project/architecture.rs)"
        );
        assert!(
            !PLANNED.contains(&module.as_str()),
            "src/{module} exists now: delete `{module}` from PLANNED (tests/project/architecture.rs)"
        );
    }
    for row in LAYERS {
        assert!(
            modules.contains(row.module) || PLANNED.contains(&row.module),
            "LAYERS has a row for `{}`, which is not under src/ (and not in PLANNED)",
            row.module
        );
        assert!(
            !row.why.is_empty(),
            "`{}`: say why it sits at rank {}",
            row.module,
            row.rank
        );
    }
    let mut seen = BTreeSet::new();
    for row in LAYERS {
        assert!(
            seen.insert(row.module),
            "`{}` has two rows in LAYERS",
            row.module
        );
    }
    for (from, to, why) in PENDING {
        let (Some(f), Some(t)) = (row_of(from), row_of(to)) else {
            panic!("PENDING `{from}` → `{to}` names a module without a row");
        };
        assert!(
            t.rank >= f.rank && !why.is_empty(),
            "PENDING `{from}` → `{to}` is allowed by the ranks anyway, or says no reason: delete it"
        );
    }
}

// ---------------------------------------------------------------------------
// The checker itself: each rule fails on a planted import.

fn planted(files: &[(&str, &str)]) -> Vec<String> {
    let files: Vec<(String, String)> = files
        .iter()
        .map(|(f, s)| (f.to_string(), s.to_string()))
        .collect();
    check(&files)
}

#[test]
fn a_leaf_importing_nixl_is_caught_with_its_file_and_line() {
    let problems = planted(&[(
        "src/memory/cuda.rs",
        "//! doc\n\nuse std::sync::Arc;\nuse crate::nixl::{MemKind, MemRegion};\n",
    )]);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].starts_with("src/memory/cuda.rs:4: `memory` (rank 1) imports `nixl` (rank 2)"),
        "{}",
        problems[0]
    );
}

#[test]
fn grouped_uses_inline_paths_and_super_chains_are_seen() {
    let problems = planted(&[
        (
            "src/geometry/model.rs",
            "use crate::{\n    memory::HostArena,\n    nixl::{self, DescRow},\n};\n",
        ),
        (
            "src/nixl/loopback.rs",
            "fn f() {\n    let _ = crate::connector::Worker::new();\n}\n",
        ),
        (
            "src/connector/pull.rs",
            "mod inner {\n    use super::super::super::scenario::Case;\n}\n",
        ),
    ]);
    let joined = problems.join("\n");
    assert!(
        joined.contains("src/geometry/model.rs:2: `geometry` (rank 1) imports `memory` (rank 1)"),
        "{joined}"
    );
    assert!(
        joined.contains("src/geometry/model.rs:3: `geometry` (rank 1) imports `nixl` (rank 2)"),
        "{joined}"
    );
    assert!(
        joined.contains("src/nixl/loopback.rs:2: `nixl` (rank 2) imports `connector` (rank 3)"),
        "{joined}"
    );
    assert!(
        joined
            .contains("src/connector/pull.rs:2: `connector` (rank 3) imports `scenario` (rank 7)"),
        "{joined}"
    );
}

#[test]
fn comments_strings_and_external_crates_are_not_imports() {
    let problems = planted(&[(
        "src/memory/host.rs",
        "//! See crate::nixl::MemRegion.\n/* crate::connector::x */\n\
         use std::sync::Arc;\nuse serde::Serialize;\n\
         const S: &str = \"crate::nixl::Loopback\";\nconst R: &str = r#\"crate::scenario\"#;\n\
         fn f<'a>(c: char) -> bool { c == '\"' }\npub(crate) fn g() {}\n",
    )]);
    assert!(problems.is_empty(), "{problems:?}");
}

#[test]
fn an_upward_import_between_harness_modules_is_caught_with_both_ranks() {
    let problems = planted(&[
        ("src/layout/mod.rs", "use crate::pattern::fill;\n"),
        ("src/pattern.rs", "\nuse crate::layout::CaseLayout;\n"),
    ]);
    let joined = problems.join("\n");
    assert_eq!(problems.len(), 2, "{joined}");
    assert!(
        joined.contains(
            "src/layout/mod.rs:1: `layout` (rank 4) imports `pattern` (rank 5): \
             an import must point to a strictly lower rank"
        ),
        "{joined}"
    );
    assert!(
        joined.contains("import cycle between modules: `layout` → `pattern` (src/layout/mod.rs:1) → `layout` (src/pattern.rs:2)"),
        "{joined}"
    );
}

#[test]
fn an_import_within_one_rank_is_caught() {
    let problems = planted(&[("src/scheduler.rs", "use crate::layout::Side;\n")]);
    assert_eq!(
        problems,
        [
            "src/scheduler.rs:1: `scheduler` (rank 4) imports `layout` (rank 4): \
          an import must point to a strictly lower rank (tests/project/architecture.rs LAYERS)"
        ]
    );
}

#[test]
fn under_test_importing_a_driver_protocol_is_caught() {
    // `under_test` is the interface, the neutral record and the judge: each
    // connector converts its own driver's log into the record in its own
    // module, so `under_test` imports none of them (nor the driver room).
    assert!(PENDING.is_empty(), "{PENDING:?}");
    let problems = planted(&[
        (
            "src/under_test/record.rs",
            "use crate::live::protocol::CaseResult;\nuse crate::sglang::result::DriverResult;\n\
             use crate::trace::run_trace::RecordedCase;\nuse crate::driver::DriverRun;\n",
        ),
        ("src/under_test/mod.rs", "pub mod record;\n"),
    ]);
    let rule =
        "an import must point to a strictly lower rank (tests/project/architecture.rs LAYERS)";
    assert_eq!(
        problems,
        [
            format!("src/under_test/record.rs:1: `under_test` (rank 8) imports `live` (rank 9): {rule}"),
            format!("src/under_test/record.rs:2: `under_test` (rank 8) imports `sglang` (rank 11): {rule}"),
            format!("src/under_test/record.rs:3: `under_test` (rank 8) imports `trace` (rank 10): {rule}"),
            format!("src/under_test/record.rs:4: `under_test` (rank 8) imports `driver` (rank 8): {rule}"),
        ]
    );
    assert!(stale_pending(&[]).is_empty());
}

#[test]
fn a_pub_mod_below_the_root_of_live_or_derive_is_caught() {
    let problems = planted(&[
        (
            "src/live/mod.rs",
            "//! doc\npub(crate) mod batch;\npub mod run;\nmod shrink;\npub use run::LiveReport;\n",
        ),
        (
            "src/derive/pair.rs",
            "pub(crate) fn f() {}\npub mod inner {}\n",
        ),
        ("src/connector/mod.rs", "pub mod post_process;\n"),
    ]);
    assert_eq!(
        problems,
        [
            "src/live/mod.rs:3: `pub mod run` below the root of `live`: make it `pub(crate)` \
             and re-export what the API needs from src/live/mod.rs, as `connector` does",
            "src/derive/pair.rs:2: `pub mod inner` below the root of `derive`: make it \
             `pub(crate)` and re-export what the API needs from src/derive/mod.rs, as \
             `connector` does",
        ]
    );
}

#[test]
fn a_cycle_between_files_of_one_module_is_caught_through_reexports() {
    let problems = planted(&[
        (
            "src/scenario/mod.rs",
            "pub mod engines;\npub mod vram;\npub use engines::Engines;\n",
        ),
        (
            "src/scenario/engines.rs",
            "use super::vram::RankDevice;\npub struct Engines;\n",
        ),
        ("src/scenario/vram.rs", "use crate::scenario::Engines;\n"),
    ]);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].contains("import cycle between files of `scenario`"),
        "{}",
        problems[0]
    );
}

#[test]
fn an_unknown_module_and_a_connector_importing_the_harness_are_caught() {
    let problems = planted(&[
        ("src/newthing.rs", "use crate::geometry::Geometry;\n"),
        (
            "src/connector/worker.rs",
            "use crate::scheduler::RequestShape;\n",
        ),
        ("src/connector/push.rs", "use crate::defects::Defect;\n"),
    ]);
    let joined = problems.join("\n");
    assert_eq!(problems.len(), 3, "{joined}");
    assert!(
        joined.contains("src/connector/push.rs:1: `connector` (rank 3) imports `defects` (rank 4)"),
        "{joined}"
    );
    assert!(
        joined.contains("src/newthing.rs:1: module `newthing` is not in the layer table"),
        "{joined}"
    );
    assert!(
        joined.contains(
            "src/connector/worker.rs:1: `connector` (rank 3) imports `scheduler` (rank 4)"
        ),
        "{joined}"
    );
}

// ---------------------------------------------------------------------------
// Typed errors: library code returns error types, never bare strings.

/// Whether the tokens of a `Result`'s error type are a string: `String`
/// (by any path), `&str` (any lifetime) or a `Box<dyn .. Error ..>`.
fn is_string_error(arg: &[&str]) -> bool {
    match arg {
        ["&", "str"] | ["&", _, "str"] => true,
        [.., "String"] => arg[..arg.len() - 1]
            .iter()
            .all(|t| matches!(*t, "std" | "alloc" | "string" | "::")),
        ["Box", "<", "dyn", rest @ ..] => rest.iter().any(|t| t.ends_with("Error")),
        _ => false,
    }
}

/// Every `Result<_, String>` written under `src/` (return types, type
/// aliases, parameters, turbofish alike), as `file:line: Result<..>`.
/// `&str` and `Box<dyn Error>` errors count as strings too.
fn string_errors(files: &[(String, String)]) -> Vec<String> {
    let mut found = Vec::new();
    for (file, src) in files {
        let tokens = lex(src);
        for (i, t) in tokens.iter().enumerate() {
            if t.text != "Result" {
                continue;
            }
            let mut j = i + 1;
            if tokens.get(j).is_some_and(|t| t.text == "::") {
                j += 1;
            }
            if tokens.get(j).is_none_or(|t| t.text != "<") {
                continue;
            }
            // The generic arguments at depth 1; `->` inside them is no `>`.
            let mut args: Vec<Vec<&str>> = vec![Vec::new()];
            let mut depth = 0usize;
            for k in j..tokens.len() {
                let text = tokens[k].text.as_str();
                let arrow = text == ">" && k > 0 && tokens[k - 1].text == "-";
                match text {
                    "<" | "(" | "[" => depth += 1,
                    ">" | ")" | "]" if !arrow => depth -= 1,
                    _ => {}
                }
                if depth == 0 {
                    break;
                }
                if text == "," && depth == 1 {
                    args.push(Vec::new());
                } else if !(depth == 1 && text == "<" && k == j) {
                    args.last_mut().expect("one argument").push(text);
                }
            }
            if let [ok, error] = args.as_slice() {
                if is_string_error(error) {
                    found.push(format!(
                        "{file}:{}: Result<{}, {}>",
                        t.line,
                        ok.join(" "),
                        error.join(" ")
                    ));
                }
            }
        }
    }
    found
}

#[test]
fn library_code_returns_typed_errors_not_strings() {
    let files = source_files();
    let found = string_errors(&files);
    assert!(
        found.is_empty(),
        "{} `Result<_, String>` under src/: return a typed error (a thiserror enum \
         whose variants carry the values and the source error) and turn it into text \
         where it is printed:\n{}",
        found.len(),
        found.join("\n")
    );
}

#[test]
fn string_errors_are_found_in_every_spelling_and_only_there() {
    let files: Vec<(String, String)> = [(
        "src/sweep/shard.rs",
        "/// Result<(), String> in a doc comment is no code.\n\
         pub fn a() -> Result<(u32, u32), String> { todo!() }\n\
         type R<T> = std::result::Result<T, std::string::String>;\n\
         fn b(f: &dyn Fn() -> Result<Vec<Option<u8>>, &'static str>) {}\n\
         fn c() -> Result<impl Fn(u8) -> u8, Box<dyn std::error::Error + Send>> { todo!() }\n\
         fn d() { let _ = Result::<(), String>::Ok(()); }\n\
         fn e() -> Result<String, ShardError> { todo!() }\n\
         fn f() -> Result<Vec<String>, Outcome> { todo!() }\n\
         const S: &str = \"Result<(), String>\";\n\
         fn g() -> io::Result<String> { todo!() }\n",
    )]
    .iter()
    .map(|(f, s)| (f.to_string(), s.to_string()))
    .collect();
    let found = string_errors(&files);
    assert_eq!(
        found,
        [
            "src/sweep/shard.rs:2: Result<( u32 , u32 ), String>",
            "src/sweep/shard.rs:3: Result<T, std :: string :: String>",
            "src/sweep/shard.rs:4: Result<Vec < Option < u8 > >, & static str>",
            "src/sweep/shard.rs:5: Result<impl Fn ( u8 ) - > u8, Box < dyn std :: error :: Error + Send >>",
            "src/sweep/shard.rs:6: Result<( ), String>",
        ]
    );
}

// ---------------------------------------------------------------------------
// Release-specific identifiers: the release under test is a value
// (`under_test::CodeUnderTest`), looked up in the release table; only that
// table and the policy that models the release spell a release in code.

/// Spellings of a release in identifiers (as `grep` finds them, comments included).
const RELEASE_IDENTIFIERS: [&str; 7] = [
    "Vllm0330",
    "vllm_0_33_0",
    "VLLM_0_33_0",
    "Vllm0340",
    "vllm_0_34_0",
    "VLLM_0_34_0",
    "PINNED_",
];

/// The only files of `src/` that may write them: the release table and the
/// policy that models the release.
const RELEASE_FILES: [&str; 2] = ["src/under_test/code.rs", "src/connector/policy.rs"];

/// Every line of a file outside [`RELEASE_FILES`] that writes a release
/// identifier, as `file:line: identifier`.
fn release_identifiers(files: &[(String, String)]) -> Vec<String> {
    let mut found = Vec::new();
    for (file, text) in files {
        if RELEASE_FILES.contains(&file.as_str()) {
            continue;
        }
        for (n, line) in text.lines().enumerate() {
            for ident in RELEASE_IDENTIFIERS {
                if line.contains(ident) {
                    found.push(format!("{file}:{}: {ident}", n + 1));
                }
            }
        }
    }
    found
}

#[test]
fn release_identifiers_appear_only_in_the_release_table_and_its_policy() {
    let files = source_files();
    for allowed in RELEASE_FILES {
        assert!(
            files.iter().any(|(f, _)| f == allowed),
            "{allowed} is gone: update RELEASE_FILES"
        );
    }
    let found = release_identifiers(&files);
    assert!(
        found.is_empty(),
        "{} release-specific identifier(s) outside {}: look the release up in the release \
         table instead (`Release::pinned()`, `CodeUnderTest::reference_policy()`):\n{}",
        found.len(),
        RELEASE_FILES.join(" and "),
        found.join("\n")
    );
}

#[test]
fn a_release_identifier_outside_the_two_files_is_named_with_its_line() {
    let files: Vec<(String, String)> = [
        ("src/connector/policy.rs", "pub fn vllm_0_33_0() {}\n"),
        ("src/under_test/code.rs", "policy: NamedPolicy::Vllm0330,\n"),
        (
            "src/live/run.rs",
            "// vLLM 0.33.0 in prose is fine\nlet p = NamedPolicy::Vllm0330;\n",
        ),
        ("src/cli/live.rs", "const PINNED_X: &str = \"\";\n"),
    ]
    .iter()
    .map(|(f, s)| (f.to_string(), s.to_string()))
    .collect();
    assert_eq!(
        release_identifiers(&files),
        ["src/live/run.rs:2: Vllm0330", "src/cli/live.rs:1: PINNED_"]
    );
}

// The one sweep and explain (`src/cli/pipeline.rs`) run whatever
// `src/cli/connectors.rs` builds: that factory is the only place that
// turns a `--connector` value into a connector, so adding one is a module
// and one line there.

/// The files that may name a `--connector` value's variants: where they
/// are defined, the factory, and the run options' cross-connector
/// refusals (an option of one connector given to another).
const CONNECTOR_NAMING_FILES: [&str; 3] = [
    "src/cli/choices.rs",
    "src/cli/connectors.rs",
    "src/cli/run_args.rs",
];

/// Every line outside the factory that builds a pipeline connector
/// (`...Pipeline::new(`), and every line outside
/// [`CONNECTOR_NAMING_FILES`] that names a `ConnectorArg` variant, as
/// `file:line: what`.
fn connectors_named_outside_the_factory(files: &[(String, String)]) -> Vec<String> {
    let mut found = Vec::new();
    for (file, text) in files {
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            if code.contains("ConnectorArg::") && !CONNECTOR_NAMING_FILES.contains(&file.as_str()) {
                found.push(format!("{file}:{}: ConnectorArg", n + 1));
            }
            let builds = code
                .split("Pipeline::new(")
                .next()
                .is_some_and(|before| before.len() < code.len());
            if builds && file != "src/cli/connectors.rs" {
                found.push(format!("{file}:{}: Pipeline::new", n + 1));
            }
        }
    }
    found
}

#[test]
fn only_the_factory_builds_a_connector_for_the_one_pipeline() {
    let files = source_files();
    for allowed in CONNECTOR_NAMING_FILES {
        assert!(
            files.iter().any(|(f, _)| f == allowed),
            "{allowed} is gone: update CONNECTOR_NAMING_FILES"
        );
    }
    let found = connectors_named_outside_the_factory(&files);
    assert!(
        found.is_empty(),
        "{} place(s) choose a connector outside src/cli/connectors.rs (`build`): \
         the one sweep and explain take the connector it builds:\n{}",
        found.len(),
        found.join("\n")
    );
}

#[test]
fn a_connector_chosen_outside_the_factory_is_named_with_its_line() {
    let files: Vec<(String, String)> = [
        (
            "src/cli/connectors.rs",
            "ConnectorArg::Vllm => Box::new(super::live::VllmPipeline::new()),\n",
        ),
        (
            "src/cli/matrix.rs",
            "// ConnectorArg::Vllm in a comment is fine\nlet c = VllmPipeline::new();\n",
        ),
        (
            "src/cli/sweep.rs",
            "if args.run.connector == ConnectorArg::Sglang {\n",
        ),
        (
            "src/cli/run_args.rs",
            "self.connector == ConnectorArg::Kvgeom\n",
        ),
    ]
    .iter()
    .map(|(f, s)| (f.to_string(), s.to_string()))
    .collect();
    assert_eq!(
        connectors_named_outside_the_factory(&files),
        [
            "src/cli/matrix.rs:2: Pipeline::new",
            "src/cli/sweep.rs:1: ConnectorArg"
        ]
    );
}
