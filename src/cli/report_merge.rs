//! `kvgeom report merge`: join the JSON or JUnit reports of a sharded sweep
//! into the report one run would have written, with that run's exit status.

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;

use serde_json::{json, Value};

use super::{EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK};
use crate::limits::{read_capped, MAX_INPUT_BYTES};
use crate::report::junit::{self, JunitCase};
use crate::report::sweep_report::SWEEP_SCHEMA;
use crate::sweep::shard::Shard;

/// The two report formats a sweep's shards can be merged in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReportKind {
    /// `--format json`.
    Json,
    /// `--format junit`.
    Junit,
}

impl ReportKind {
    fn name(self) -> &'static str {
        match self {
            ReportKind::Json => "JSON",
            ReportKind::Junit => "JUnit",
        }
    }

    /// Where the report keeps the shard's number, count, total and
    /// fingerprint, each case's position, and what ran.
    fn fields(self) -> Fields {
        match self {
            ReportKind::Json => Fields {
                shard: "`shard`",
                count: "`shard.count`",
                total: "`shard.total_cases`",
                fingerprint: "`shard.fingerprint`",
                index: "`cases[].index`",
                code: "`code_under_test`",
            },
            ReportKind::Junit => Fields {
                shard: "property kvgeom.shard",
                count: "the N of property kvgeom.shard",
                total: "property kvgeom.total_cases",
                fingerprint: "property kvgeom.fingerprint",
                index: "property kvgeom.index",
                code: "properties kvgeom.code_under_test.*",
            },
        }
    }
}

struct Fields {
    shard: &'static str,
    count: &'static str,
    total: &'static str,
    fingerprint: &'static str,
    index: &'static str,
    code: &'static str,
}

/// Why the shards cannot be merged. Each message names the file, the field
/// and the value.
#[derive(Debug, thiserror::Error)]
pub enum MergeError {
    /// A file could not be read, or is above the input limit.
    #[error("{0}")]
    Input(#[from] crate::limits::InputError),
    /// No file was given.
    #[error("no report given: name the report of every shard")]
    NoFiles,
    /// Neither JSON nor XML.
    #[error("{file}: neither a JSON nor a JUnit sweep report: {why}")]
    Unrecognized {
        /// The report.
        file: String,
        /// What it holds instead.
        why: String,
    },
    /// JSON or XML, but not a kvgeom sweep report.
    #[error("{file}: not a kvgeom {kind} sweep report: {why}")]
    NotAReport {
        /// The report.
        file: String,
        /// `JSON` or `JUnit`.
        kind: &'static str,
        /// What is wrong.
        why: String,
    },
    /// XML, but not a kvgeom JUnit sweep report.
    #[error("{file}: not a kvgeom JUnit sweep report: {source}")]
    NotAJunitReport {
        /// The report.
        file: String,
        /// What is wrong, and where.
        #[source]
        source: junit::JunitReadError,
    },
    /// A JSON report of another schema.
    #[error("{file}: `schema` is {found}; report merge reads `{SWEEP_SCHEMA}`")]
    Schema {
        /// The report.
        file: String,
        /// The schema, quoted, or `missing`.
        found: String,
    },
    /// JSON and JUnit reports given together.
    #[error(
        "{file} is a {kind} report but {first} is {first_kind}: give every shard's report in one format"
    )]
    Mixed {
        /// The report.
        file: String,
        /// Its format.
        kind: &'static str,
        /// The first report given.
        first: String,
        /// Its format.
        first_kind: &'static str,
    },
    /// A report written without `--shard`.
    #[error("{file}: no {field}: written without --shard, so not a shard of a sweep")]
    NotAShard {
        /// The report.
        file: String,
        /// Where a shard's report keeps the shard.
        field: &'static str,
    },
    /// Two reports of different sweeps.
    #[error("{file}: {field} is {found}, but {first} has {expected}: not shards of one sweep")]
    Mismatch {
        /// The report.
        file: String,
        /// The first report given.
        first: String,
        /// The field that differs.
        field: &'static str,
        /// Its value here.
        found: String,
        /// Its value in the first report.
        expected: String,
    },
    /// One shard given twice.
    #[error("shard {index}/{count} is given twice: {first} and {second}")]
    Duplicate {
        /// The shard.
        index: u32,
        /// How many shards the sweep has.
        count: u32,
        /// The first report of it.
        first: String,
        /// The second.
        second: String,
    },
    /// A shard not given.
    #[error("shard {missing}/{count} is missing (given: {given}): give the report of every shard")]
    Missing {
        /// The first shard missing.
        missing: u32,
        /// How many shards the sweep has.
        count: u32,
        /// The shards given.
        given: String,
    },
    /// A shard holding more or fewer cases than its share.
    #[error(
        "{file}: shard {index}/{count} of a sweep of {total} cases ({total_field}) holds \
         {held} cases; it must hold {expected}"
    )]
    WrongCount {
        /// The report.
        file: String,
        /// The shard.
        index: u32,
        /// How many shards the sweep has.
        count: u32,
        /// The sweep's cases.
        total: usize,
        /// Where the total is kept.
        total_field: &'static str,
        /// The cases the report holds.
        held: usize,
        /// The shard's share.
        expected: usize,
    },
    /// A case's position is not one of its shard's.
    #[error("{file}: {field} {index}: {why}")]
    BadIndex {
        /// The report.
        file: String,
        /// Where the position is kept.
        field: &'static str,
        /// The position.
        index: u64,
        /// What is wrong with it.
        why: String,
    },
    /// A case without its position.
    #[error("{file}: {case} has no {field}")]
    NoIndex {
        /// The report.
        file: String,
        /// The case.
        case: String,
        /// Where the position is kept.
        field: &'static str,
    },
}

/// One shard's report, read.
struct Part<C> {
    file: String,
    shard: Shard,
    /// What ran the shard: a JSON report's `code_under_test` (`null`
    /// when absent), a JUnit report's `kvgeom.code_under_test.*` properties
    /// as `[name, value]` pairs in document order.
    code: Value,
    /// Each case with its position in the whole sweep.
    cases: Vec<(u64, C)>,
}

/// The format of `bytes`, by their first character.
fn kind_of(file: &str, bytes: &[u8]) -> Result<ReportKind, MergeError> {
    let body = bytes.strip_prefix(b"\xef\xbb\xbf").unwrap_or(bytes);
    match body.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{') => Ok(ReportKind::Json),
        Some(b'<') => Ok(ReportKind::Junit),
        first => Err(MergeError::Unrecognized {
            file: file.to_string(),
            why: match first {
                None => "the file is empty".into(),
                Some(b) => format!(
                    "it starts with `{}`; a JSON report starts with `{{`, a JUnit report with `<`",
                    char::from(*b).escape_default()
                ),
            },
        }),
    }
}

/// One report as its format holds it, before the shard is required: the
/// shard (`None`: written without `--shard`) and each case with its
/// position, if it has one, and how to name the case.
struct Unchecked<C> {
    shard: Option<Shard>,
    /// What ran, as [`Part::code`] holds it.
    code: Value,
    cases: Vec<(Option<u64>, String, C)>,
}

fn not_a_report(file: &str, kind: ReportKind, why: String) -> MergeError {
    MergeError::NotAReport {
        file: file.to_string(),
        kind: kind.name(),
        why,
    }
}

/// One shard's report, of either format, as a part of the sweep: the shard
/// and every case's position are required.
fn into_part<C>(
    file: &str,
    kind: ReportKind,
    unchecked: Unchecked<C>,
) -> Result<Part<C>, MergeError> {
    let fields = kind.fields();
    let Some(shard) = unchecked.shard else {
        return Err(MergeError::NotAShard {
            file: file.to_string(),
            field: fields.shard,
        });
    };
    let cases = unchecked
        .cases
        .into_iter()
        .map(|(index, name, case)| match index {
            Some(index) => Ok((index, case)),
            None => Err(MergeError::NoIndex {
                file: file.to_string(),
                case: name,
                field: fields.index,
            }),
        })
        .collect::<Result<_, _>>()?;
    Ok(Part {
        file: file.to_string(),
        shard,
        code: unchecked.code,
        cases,
    })
}

fn read_json(file: &str, bytes: &[u8]) -> Result<Unchecked<Value>, MergeError> {
    let not_report = |why: String| not_a_report(file, ReportKind::Json, why);
    let mut value: Value = serde_json::from_slice(bytes).map_err(|e| not_report(e.to_string()))?;
    let schema = value.get("schema");
    if schema.and_then(Value::as_str) != Some(SWEEP_SCHEMA) {
        return Err(MergeError::Schema {
            file: file.to_string(),
            found: match schema {
                None => "missing".into(),
                Some(Value::String(s)) => format!("`{s}`"),
                Some(other) => format!("`{other}`, not a string"),
            },
        });
    }
    let Some(shard) = value.get("shard") else {
        return Ok(Unchecked {
            shard: None,
            code: Value::Null,
            cases: Vec::new(),
        });
    };
    let shard: Shard =
        serde_json::from_value(shard.clone()).map_err(|e| not_report(format!("`shard`: {e}")))?;
    let code = value.get("code_under_test").cloned().unwrap_or(Value::Null);
    let Some(Value::Array(cases)) = value.get_mut("cases").map(Value::take) else {
        return Err(not_report("no `cases` array".into()));
    };
    let cases = cases
        .into_iter()
        .enumerate()
        .map(|(i, mut case)| {
            let index = case.as_object_mut().and_then(|o| o.remove("index"));
            (
                index.as_ref().and_then(Value::as_u64),
                format!("cases[{i}]"),
                case,
            )
        })
        .collect();
    Ok(Unchecked {
        shard: Some(shard),
        code,
        cases,
    })
}

fn read_junit(file: &str, bytes: &[u8]) -> Result<Unchecked<JunitCase>, MergeError> {
    let text = std::str::from_utf8(bytes)
        .map_err(|e| not_a_report(file, ReportKind::Junit, format!("not UTF-8: {e}")))?;
    let report = junit::read(text).map_err(|source| MergeError::NotAJunitReport {
        file: file.to_string(),
        source,
    })?;
    let cases = report
        .cases
        .into_iter()
        .map(|(index, case)| {
            let name = format!("testcase `{}` of testsuite `{}`", case.name, case.suite);
            (index, name, case)
        })
        .collect();
    Ok(Unchecked {
        shard: report.shard,
        code: json!(report.code),
        cases,
    })
}

/// The cases of shard `index` of `count` in a sweep of `total`.
fn share(total: usize, index: u32, count: u32) -> usize {
    let (count, before) = (count as usize, (index - 1) as usize);
    total / count + usize::from(before < total % count)
}

/// Check that `part` holds exactly its shard's share, each position once.
fn check_part<C>(part: &Part<C>, kind: ReportKind) -> Result<(), MergeError> {
    let f = kind.fields();
    let s = &part.shard;
    let expected = share(s.total_cases, s.index, s.count);
    if part.cases.len() != expected {
        return Err(MergeError::WrongCount {
            file: part.file.clone(),
            index: s.index,
            count: s.count,
            total: s.total_cases,
            total_field: f.total,
            held: part.cases.len(),
            expected,
        });
    }
    let mut seen = HashSet::new();
    for &(index, _) in &part.cases {
        let bad = |why: String| MergeError::BadIndex {
            file: part.file.clone(),
            field: f.index,
            index,
            why,
        };
        if index >= s.total_cases as u64 {
            return Err(bad(format!(
                "outside the sweep's {} cases (0 to {})",
                s.total_cases,
                s.total_cases.saturating_sub(1)
            )));
        }
        let owner = index % u64::from(s.count) + 1;
        if owner != u64::from(s.index) {
            return Err(bad(format!(
                "a case of shard {owner}/{}, not of this shard {}/{}",
                s.count, s.index, s.count
            )));
        }
        if !seen.insert(index) {
            return Err(bad("given twice".into()));
        }
    }
    Ok(())
}

/// The cases, and what ran them (every shard's [`Part::code`] is equal).
type Assembled<C> = (Vec<C>, Value);

/// Every shard 1..N once, of one sweep, naming the same code under test;
/// the cases in sweep order.
fn assemble<C>(parts: Vec<Part<C>>, kind: ReportKind) -> Result<Assembled<C>, MergeError> {
    let f = kind.fields();
    let Some(first) = parts.first() else {
        return Err(MergeError::NoFiles);
    };
    let (first_file, reference) = (first.file.clone(), first.shard.clone());
    let code = first.code.clone();
    let mut by_index: BTreeMap<u32, Part<C>> = BTreeMap::new();
    for part in parts {
        let s = &part.shard;
        let checks = [
            (f.count, s.count.to_string(), reference.count.to_string()),
            (
                f.fingerprint,
                format!("`{}`", s.fingerprint),
                format!("`{}`", reference.fingerprint),
            ),
            (
                f.total,
                s.total_cases.to_string(),
                reference.total_cases.to_string(),
            ),
        ];
        let code_check = (f.code, format!("`{}`", part.code), format!("`{code}`"));
        for (field, found, expected) in checks.into_iter().chain([code_check]) {
            if found != expected {
                return Err(MergeError::Mismatch {
                    file: part.file,
                    first: first_file,
                    field,
                    found,
                    expected,
                });
            }
        }
        if let Some(other) = by_index.get(&s.index) {
            return Err(MergeError::Duplicate {
                index: s.index,
                count: s.count,
                first: other.file.clone(),
                second: part.file,
            });
        }
        check_part(&part, kind)?;
        by_index.insert(part.shard.index, part);
    }
    if let Some(missing) = (1..=reference.count).find(|k| !by_index.contains_key(k)) {
        let given: Vec<String> = by_index
            .keys()
            .map(|k| format!("{k}/{}", reference.count))
            .collect();
        return Err(MergeError::Missing {
            missing,
            count: reference.count,
            given: given.join(", "),
        });
    }
    // Every shard holds its share of positions, each once: together they
    // fill 0..total exactly.
    let mut slots: Vec<Option<C>> = Vec::new();
    slots.resize_with(reference.total_cases, || None);
    for part in by_index.into_values() {
        for (index, case) in part.cases {
            slots[index as usize] = Some(case);
        }
    }
    Ok((slots.into_iter().flatten().collect(), code))
}

/// Merge `files` into one report (the JSON or JUnit text the unsharded run
/// writes) and the exit status that run has.
pub fn merge(files: &[PathBuf]) -> Result<(String, u8), MergeError> {
    let mut json_parts = Vec::new();
    let mut junit_parts = Vec::new();
    let mut first: Option<(String, ReportKind)> = None;
    for path in files {
        let file = path.display().to_string();
        let bytes = read_capped(path, MAX_INPUT_BYTES)?;
        let kind = kind_of(&file, &bytes)?;
        match &first {
            Some((first_file, first_kind)) if *first_kind != kind => {
                return Err(MergeError::Mixed {
                    file,
                    kind: kind.name(),
                    first: first_file.clone(),
                    first_kind: first_kind.name(),
                })
            }
            Some(_) => {}
            None => first = Some((file.clone(), kind)),
        }
        match kind {
            ReportKind::Json => json_parts.push(into_part(&file, kind, read_json(&file, &bytes)?)?),
            ReportKind::Junit => {
                junit_parts.push(into_part(&file, kind, read_junit(&file, &bytes)?)?)
            }
        }
    }
    match first.map(|(_, kind)| kind) {
        None => Err(MergeError::NoFiles),
        Some(ReportKind::Json) => {
            let (cases, code) = assemble(json_parts, ReportKind::Json)?;
            let passed = cases
                .iter()
                .filter(|c| c.get("passed").and_then(Value::as_bool) == Some(true))
                .count();
            // A case vLLM's scheduler cannot make is counted apart.
            let not_reachable = cases
                .iter()
                .filter(|c| c["outcome"]["kind"].as_str() == Some("not_reachable"))
                .count();
            let failed = cases.len() - passed - not_reachable;
            // Shards of another connector than kvgeom's (`vllm`, `replay`:
            // each case names it) keep the top-level `connector`.
            let connector = cases
                .first()
                .and_then(|c| c.get("connector"))
                .and_then(Value::as_str)
                .filter(|first| {
                    cases
                        .iter()
                        .all(|c| c.get("connector").and_then(Value::as_str) == Some(first))
                })
                .map(str::to_string);
            let live = connector.as_deref() == Some("vllm");
            let mut merged = json!({
                "schema": SWEEP_SCHEMA,
                "summary": {"cases": cases.len(), "passed": passed, "failed": failed},
                "cases": cases,
            });
            if not_reachable > 0 {
                merged["summary"]["not_reachable"] = not_reachable.into();
            }
            if !code.is_null() {
                merged["code_under_test"] = code;
            }
            if let Some(connector) = connector {
                merged["connector"] = connector.into();
            }
            if live {
                // What moved the bytes, when every case names the same.
                for key in ["nixl", "nixl_version"] {
                    let first = cases[0].get(key).and_then(Value::as_str);
                    if let Some(v) = first.filter(|v| {
                        cases
                            .iter()
                            .all(|c| c.get(key).and_then(Value::as_str) == Some(v))
                    }) {
                        merged[key] = v.into();
                    }
                }
            }
            let text = serde_json::to_string_pretty(&merged).unwrap_or_default();
            Ok((text, if failed > 0 { EXIT_FAILED } else { EXIT_OK }))
        }
        Some(ReportKind::Junit) => {
            let (cases, code) = assemble(junit_parts, ReportKind::Junit)?;
            let failed = cases.iter().any(|c| c.failure.is_some());
            let code: Vec<(String, String)> = serde_json::from_value(code).unwrap_or_default();
            let text = junit::write(&cases, None, &code);
            Ok((text, if failed { EXIT_FAILED } else { EXIT_OK }))
        }
    }
}

/// The command line of `kvgeom report merge`.
#[derive(Clone, Debug, clap::Args)]
pub struct ReportMergeArgs {
    /// The report of every shard, all JSON or all JUnit.
    #[arg(required = true, value_name = "REPORT")]
    pub files: Vec<PathBuf>,
    /// Write the merged report here instead of stdout.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// The `kvgeom report merge` command.
pub fn report_merge(args: &ReportMergeArgs) -> u8 {
    let out = args.out.as_deref();
    match merge(&args.files) {
        Ok((mut text, code)) => {
            if !text.ends_with('\n') {
                text.push('\n');
            }
            match out {
                Some(path) => {
                    if let Err(code) = super::write_output("--out", path, &text) {
                        return code;
                    }
                }
                None => out!("{text}"),
            }
            code
        }
        Err(e) => {
            eprintln!("error: {e}");
            EXIT_BAD_INPUT
        }
    }
}
