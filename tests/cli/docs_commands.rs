//! The documentation is executable where it shows commands: every `kvgeom`
//! command line of README.md, CONTRIBUTING.md and docs/ (code blocks and
//! inline code) parses, every repository file it names exists, and every
//! relative link and anchor of those pages resolves. The README's map links
//! every page of docs/, and the oracle and defect pages name every oracle
//! and defect the library has.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use kvgeom::defects::Defect;
use kvgeom::oracle::ORACLES;

use crate::support::root;

/// The pages checked, relative to the root.
fn pages() -> Vec<PathBuf> {
    let mut pages = vec![PathBuf::from("README.md"), PathBuf::from("CONTRIBUTING.md")];
    for dir in ["docs", "docs/findings"] {
        let mut found: Vec<PathBuf> = fs::read_dir(root().join(dir))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "md"))
            .map(|p| p.strip_prefix(root()).unwrap().to_path_buf())
            .collect();
        found.sort();
        pages.extend(found);
    }
    pages
}

fn read(page: &Path) -> String {
    fs::read_to_string(root().join(page)).unwrap_or_else(|e| panic!("{}: {e}", page.display()))
}

// ------------------------------------------------------------ extracting commands

/// One `kvgeom` command line found in a page.
#[derive(Debug)]
struct Example {
    page: PathBuf,
    line: usize,
    args: Vec<String>,
}

impl Example {
    fn at(&self) -> String {
        format!(
            "{}:{}: kvgeom {}",
            self.page.display(),
            self.line,
            self.args.join(" ")
        )
    }
}

/// Shell words of `text`, quotes removed; `None` where a comment starts.
fn words(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    for c in text.chars() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => word.push(c),
            None if c == '\'' || c == '"' => {
                quote = Some(c);
                in_word = true;
            }
            None if c.is_whitespace() => {
                if in_word {
                    out.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            None if c == '#' && !in_word => break,
            None => {
                word.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        out.push(word);
    }
    out
}

/// The kvgeom arguments of one shell command, if it runs kvgeom.
fn kvgeom_args(command: &str) -> Option<Vec<String>> {
    let mut w: Vec<String> = words(command.trim().trim_start_matches("$ "));
    // Leading environment assignments.
    while w.first().is_some_and(|t| {
        t.split_once('=').is_some_and(|(k, _)| {
            !k.is_empty()
                && k.chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        })
    }) {
        w.remove(0);
    }
    let first = w.first()?.as_str();
    if w.len() == 1 {
        return None;
    }
    let rest: Vec<String> = if first == "kvgeom" || first.ends_with("/kvgeom") {
        w[1..].to_vec()
    } else if first == "cargo" && w.get(1).is_some_and(|t| t == "run") {
        let sep = w.iter().position(|t| t == "--")?;
        let cargo = &w[2..sep];
        if cargo.iter().any(|t| t == "--example")
            || cargo
                .windows(2)
                .any(|p| p[0] == "--bin" && p[1] != "kvgeom")
        {
            return None;
        }
        w[sep + 1..].to_vec()
    } else {
        return None;
    };
    // Redirections end the arguments.
    let end = rest
        .iter()
        .position(|t| t.starts_with('>') || t.starts_with('<') || t.starts_with("2>"))
        .unwrap_or(rest.len());
    Some(rest[..end].to_vec())
}

/// Shell commands of one code-block line (already joined across `\`).
fn commands_of(line: &str) -> Vec<String> {
    let mut out = vec![line.to_string()];
    for sep in [" && ", " || ", " ; ", " | "] {
        out = out
            .iter()
            .flat_map(|c| c.split(sep).map(str::to_string))
            .collect();
    }
    out
}

/// Inline code spans of one line (outside code blocks).
fn inline_code(line: &str) -> Vec<String> {
    line.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

fn examples(page: &Path) -> Vec<Example> {
    let text = read(page);
    let mut out = Vec::new();
    let mut fence = false;
    let mut pending = String::new();
    let mut pending_line = 0;
    // Inline code may wrap, so prose is read a paragraph at a time.
    let mut paragraph = String::new();
    let mut paragraph_line = 0;
    let prose = |paragraph: &mut String, line: usize, out: &mut Vec<Example>| {
        for span in inline_code(&std::mem::take(paragraph)) {
            if let Some(args) = kvgeom_args(&span) {
                out.push(Example {
                    page: page.to_path_buf(),
                    line,
                    args,
                });
            }
        }
    };
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            prose(&mut paragraph, paragraph_line, &mut out);
            fence = !fence;
            continue;
        }
        if fence {
            if pending.is_empty() {
                pending_line = i + 1;
            }
            if let Some(head) = line.strip_suffix('\\') {
                pending.push_str(head);
                pending.push(' ');
                continue;
            }
            pending.push_str(line);
            for command in commands_of(&std::mem::take(&mut pending)) {
                if let Some(args) = kvgeom_args(&command) {
                    out.push(Example {
                        page: page.to_path_buf(),
                        line: pending_line,
                        args,
                    });
                }
            }
        } else if line.trim().is_empty() {
            prose(&mut paragraph, paragraph_line, &mut out);
        } else {
            if paragraph.is_empty() {
                paragraph_line = i + 1;
            }
            paragraph.push_str(line);
            paragraph.push(' ');
        }
    }
    prose(&mut paragraph, paragraph_line, &mut out);
    out
}

/// Values that look like placeholders but are real option values.
const UPPERCASE_VALUES: [&str; 9] = [
    "FLASH_ATTN",
    "FLASHINFER",
    "TRITON_ATTN",
    "FLASHMLA",
    "CUTLASS_MLA",
    "FLASHINFER_MLA",
    "FLASH_ATTN_MLA",
    "NHD",
    "HND",
];

/// A synopsis (`kvgeom sweep [PATH...] --prompts LIST`) rather than a
/// command: it names placeholders, alternatives or elisions.
fn is_synopsis(args: &[String]) -> bool {
    args.iter().any(|a| {
        let placeholder = a.chars().next().is_some_and(|c| c.is_ascii_uppercase())
            && a.trim_end_matches(".json")
                .chars()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || "_/".contains(c))
            && !UPPERCASE_VALUES.contains(&a.as_str());
        placeholder
            || a.contains("...")
            || a.contains('$')
            || "[]|<>{}".chars().any(|c| a.contains(c))
    })
}

/// A bare subcommand name (`kvgeom report merge`), mentioned in prose.
fn is_name(args: &[String]) -> bool {
    args.iter()
        .all(|a| a.chars().all(|c| c.is_ascii_lowercase() || c == '-') && !a.starts_with('-'))
}

/// Options whose value is a file the command writes.
const OUTPUT_OPTIONS: [&str; 5] = [
    "--out",
    "--svg",
    "--record-trace",
    "--record-traces",
    "--results",
];

/// Paths the checkout makes (build outputs; the venvs `.vllm-venv/`,
/// `.vllm-venvs/X/`, `.sglang-venv/`, `.sglang-venvs/X/`) or that stand for
/// the reader's own files.
fn is_made_path(path: &str) -> bool {
    path.starts_with('/')
        || path.starts_with("..")
        || [
            ".vllm-venv",
            ".sglang-venv",
            ".nixl-runtime",
            "target/",
            "fuzz/artifacts/",
        ]
        .iter()
        .any(|p| path.starts_with(p))
}

/// Whether `name` matches `pattern` with `*` wildcards.
fn wildcard(pattern: &str, name: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == name,
        Some((head, tail)) => {
            name.starts_with(head)
                && (0..=name.len() - head.len()).any(|i| {
                    name.is_char_boundary(head.len() + i) && wildcard(tail, &name[head.len() + i..])
                })
        }
    }
}

fn exists_in_repo(path: &str) -> bool {
    if !path.contains('*') {
        return root().join(path).exists();
    }
    let (dir, file) = path.rsplit_once('/').unwrap_or((".", path));
    let Ok(entries) = fs::read_dir(root().join(dir)) else {
        return false;
    };
    entries
        .filter_map(Result::ok)
        .any(|e| wildcard(file, &e.file_name().to_string_lossy()))
}

/// Repository files an example names that do not exist.
fn missing_files(args: &[String]) -> Vec<String> {
    let mut missing = Vec::new();
    let mut previous: Option<&str> = None;
    for arg in args {
        let (option, value) = match arg.split_once('=') {
            Some((o, v)) if o.starts_with("--") => (Some(o), v),
            _ => (previous.filter(|p| p.starts_with("--")), arg.as_str()),
        };
        previous = Some(arg);
        let looks_like_path = value.contains('/') && value.chars().any(|c| c.is_ascii_alphabetic());
        if value.starts_with('-') || !looks_like_path || is_made_path(value) {
            continue;
        }
        if option.is_some_and(|o| OUTPUT_OPTIONS.contains(&o)) {
            continue;
        }
        if !exists_in_repo(value) {
            missing.push(value.to_string());
        }
    }
    missing
}

/// What went wrong with one example, if anything.
fn problem(example: &Example) -> Option<String> {
    if is_synopsis(&example.args) {
        return None;
    }
    let missing = missing_files(&example.args);
    if !missing.is_empty() {
        return Some(format!(
            "names files that do not exist: {}",
            missing.join(", ")
        ));
    }
    let out = Command::new(env!("CARGO_BIN_EXE_kvgeom"))
        .args(&example.args)
        .current_dir(root())
        .env("KVGEOM_PARSE_ONLY", "1")
        .output()
        .expect("kvgeom runs");
    if out.status.success() {
        return None;
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    if is_name(&example.args) && stderr.contains("required arguments were not provided") {
        return None;
    }
    Some(format!(
        "does not parse: {}",
        stderr.lines().next().unwrap_or_default()
    ))
}

#[test]
fn every_documented_kvgeom_command_parses_and_names_existing_files() {
    let all: Vec<Example> = pages().iter().flat_map(|p| examples(p)).collect();
    let checked = all.iter().filter(|e| !is_synopsis(&e.args)).count();
    // The pages show many commands; finding almost none means the
    // extraction broke, not that the docs are right.
    assert!(checked > 100, "only {checked} commands found");
    let problems: Vec<String> = all
        .iter()
        .filter_map(|e| problem(e).map(|p| format!("{}\n    {p}", e.at())))
        .collect();
    println!(
        "{checked} commands checked, {} synopses skipped",
        all.len() - checked
    );
    assert!(
        problems.is_empty(),
        "{} broken examples:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn the_extraction_sees_what_a_reader_sees() {
    let args = |s: &str| kvgeom_args(s).unwrap();
    assert_eq!(
        args("KVGEOM_X=1 kvgeom sweep 'a b' --out x.json   # note"),
        ["sweep", "a b", "--out", "x.json"]
    );
    assert_eq!(
        args("cargo run --release -- sweep --transport nixl"),
        ["sweep", "--transport", "nixl"]
    );
    assert_eq!(args("target/release/kvgeom sweep > log"), ["sweep"]);
    assert_eq!(kvgeom_args("cargo run --example make -- SRC"), None);
    assert_eq!(kvgeom_args("scripts/fuzz.sh 60"), None);
    let v = |s: &str| s.split(' ').map(str::to_string).collect::<Vec<_>>();
    assert!(is_synopsis(&v("sweep [PATH...]")));
    assert!(is_synopsis(&v("explain GEOMETRY --prompt N")));
    assert!(!is_synopsis(&v("derive c.json --backend FLASH_ATTN")));
    assert_eq!(
        missing_files(&v("sweep geometries/*.toml --out new/x.json")),
        Vec::<String>::new()
    );
    assert_eq!(
        missing_files(&v("sweep geometries/no-such.toml")),
        ["geometries/no-such.toml"]
    );
    assert!(problem(&Example {
        page: "t.md".into(),
        line: 1,
        args: v("sweep --no-such-option"),
    })
    .is_some());
}

// ------------------------------------------------------------ links and anchors

/// GitHub's anchor for a heading.
fn slug(heading: &str) -> String {
    // Links in a heading keep their text.
    let mut text = String::new();
    let mut rest = heading;
    while let Some(open) = rest.find('[') {
        text.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        match after
            .find("](")
            .and_then(|close| after[close..].find(')').map(|end| (close, close + end)))
        {
            Some((close, end)) => {
                text.push_str(&after[..close]);
                rest = &after[end + 1..];
            }
            None => {
                text.push('[');
                rest = after;
            }
        }
    }
    text.push_str(rest);
    text.to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// Every anchor of a markdown file.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    let mut fence = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fence = !fence;
            continue;
        }
        if fence || !line.starts_with('#') {
            continue;
        }
        let heading = line.trim_start_matches('#');
        if !heading.starts_with(' ') {
            continue;
        }
        let base = slug(heading.trim());
        let n = seen.entry(base.clone()).or_insert(0);
        out.insert(if *n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        });
        *n += 1;
    }
    out
}

/// `(line, target)` of every markdown link outside code.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut fence = false;
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fence = !fence;
            continue;
        }
        if fence {
            continue;
        }
        // Code spans are not links.
        let prose: String = line
            .split('`')
            .enumerate()
            .map(|(k, part)| {
                if k % 2 == 0 {
                    part.to_string()
                } else {
                    " ".repeat(part.len())
                }
            })
            .collect::<Vec<_>>()
            .join(" ");
        let mut rest = prose.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            out.push((i + 1, after[..end].trim().to_string()));
            rest = &after[end..];
        }
    }
    out
}

fn broken_links(page: &Path) -> Vec<String> {
    let text = read(page);
    let dir = page.parent().unwrap_or(Path::new(""));
    let mut broken = Vec::new();
    for (line, target) in links(&text) {
        if target.contains("://") || target.starts_with("mailto:") {
            continue;
        }
        let (path, anchor) = target.split_once('#').unwrap_or((&target, ""));
        let file = if path.is_empty() {
            page.to_path_buf()
        } else {
            dir.join(path)
        };
        let at = format!("{}:{line}: ({target})", page.display());
        if !root().join(&file).exists() {
            broken.push(format!("{at}: no such file"));
            continue;
        }
        if anchor.is_empty() || file.extension().is_none_or(|e| e != "md") {
            continue;
        }
        if !anchors(&fs::read_to_string(root().join(&file)).unwrap()).contains(anchor) {
            broken.push(format!("{at}: no heading with that anchor"));
        }
    }
    broken
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    // An unclosed code block would hide the rest of its page from the checks.
    for page in pages() {
        let fences = read(&page)
            .lines()
            .filter(|l| l.trim_start().starts_with("```"))
            .count();
        assert!(
            fences % 2 == 0,
            "{}: a code block is not closed",
            page.display()
        );
    }
    let broken: Vec<String> = pages().iter().flat_map(|p| broken_links(p)).collect();
    assert!(
        broken.is_empty(),
        "{} broken links:\n{}",
        broken.len(),
        broken.join("\n")
    );
}

#[test]
fn anchors_are_githubs() {
    assert_eq!(
        slug("Trace verdicts (`kvgeom check-trace --format json`)"),
        "trace-verdicts-kvgeom-check-trace---format-json"
    );
    assert_eq!(slug("vLLM's own connector"), "vllms-own-connector");
    assert_eq!(slug("See [the table](x.md) here"), "see-the-table-here");
    let a = anchors("# A\n## A\n```\n# not a heading\n```\n### B c\n");
    assert_eq!(a, ["a", "a-1", "b-c"].map(String::from).into());
    assert_eq!(
        links("[x](a.md#b) `[y](not.md)` [z](c/)"),
        [(1, "a.md#b".into()), (1, "c/".into())]
    );
}

// ------------------------------------------------------------ the map and the lists

#[test]
fn the_readme_map_links_every_page_of_docs() {
    let readme = read(Path::new("README.md"));
    let linked: BTreeSet<String> = links(&readme)
        .into_iter()
        .map(|(_, t)| t.split('#').next().unwrap().to_string())
        .collect();
    let unlinked: Vec<String> = pages()
        .iter()
        .filter(|p| p.starts_with("docs") || p.as_path() == Path::new("CONTRIBUTING.md"))
        .filter(|p| !p.starts_with("docs/findings") || p.ends_with("README.md"))
        .map(|p| p.display().to_string())
        .filter(|p| !linked.contains(p))
        .collect();
    assert!(unlinked.is_empty(), "README.md does not link: {unlinked:?}");
}

#[test]
fn the_oracle_and_defect_pages_name_every_oracle_and_defect() {
    let oracles = read(Path::new("docs/oracles.md"));
    for o in &ORACLES {
        assert!(
            oracles.contains(&format!("`{}`", o.name)),
            "docs/oracles.md lacks oracle `{}`",
            o.name
        );
    }
    let defects = read(Path::new("docs/defects.md"));
    for d in Defect::ALL {
        assert!(
            defects.contains(&format!("| `{}` |", d.name())),
            "docs/defects.md's table lacks defect `{}`",
            d.name()
        );
    }
}
