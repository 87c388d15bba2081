//! `kvgeom report merge`: join the JSON reports of a sharded sweep into the
//! report one run would have written, with that run's exit status.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::{json, Value};

use super::{EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK};
use crate::limits::{read_capped, MAX_INPUT_BYTES};
use crate::report::sweep_report::SWEEP_SCHEMA;
use crate::sweep::shard::Shard;

/// Why the shards cannot be merged.
#[derive(Debug, thiserror::Error)]
pub enum MergeError {
    #[error("{0}")]
    Input(#[from] crate::limits::InputError),
    #[error("{file}: not a JSON sweep report: {why}")]
    NotAReport { file: String, why: String },
    #[error("{file}: schema `{found}`, expected `{SWEEP_SCHEMA}`")]
    Schema { file: String, found: String },
    #[error("{file}: not a shard (written without --shard)")]
    NotAShard { file: String },
    #[error(
        "{file}: {what} differs from {first}'s ({found} vs {expected}): not shards of one sweep"
    )]
    Mismatch {
        file: String,
        first: String,
        what: &'static str,
        found: String,
        expected: String,
    },
    #[error("shard {index}/{count} is given twice: {first} and {second}")]
    Duplicate {
        index: u32,
        count: u32,
        first: String,
        second: String,
    },
    #[error("shard {missing}/{count} is missing (given: {given})")]
    Missing {
        missing: u32,
        count: u32,
        given: String,
    },
    #[error("{file}: case index {index} is outside the sweep's {total} cases, or repeated")]
    BadIndex {
        file: String,
        index: u64,
        total: usize,
    },
}

/// Merge `files` into one report (JSON text) and the exit status a single
/// run would have had.
pub fn merge(files: &[PathBuf]) -> Result<(String, u8), MergeError> {
    let mut shards: BTreeMap<u32, (String, Shard, Vec<Value>)> = BTreeMap::new();
    let mut first: Option<(String, Shard)> = None;
    for path in files {
        let file = path.display().to_string();
        let bytes = read_capped(path, MAX_INPUT_BYTES)?;
        let not_report = |why: String| MergeError::NotAReport {
            file: file.clone(),
            why,
        };
        let value: Value = serde_json::from_slice(&bytes).map_err(|e| not_report(e.to_string()))?;
        let schema = value.get("schema").and_then(Value::as_str).unwrap_or("");
        if schema != SWEEP_SCHEMA {
            return Err(MergeError::Schema {
                file,
                found: schema.to_string(),
            });
        }
        let shard: Shard = match value.get("shard") {
            Some(s) => serde_json::from_value(s.clone()).map_err(|e| not_report(e.to_string()))?,
            None => return Err(MergeError::NotAShard { file }),
        };
        let cases = value
            .get("cases")
            .and_then(Value::as_array)
            .cloned()
            .ok_or_else(|| not_report("no `cases` array".into()))?;
        if let Some((first_file, f)) = &first {
            for (what, found, expected) in [
                (
                    "the shard count",
                    shard.count.to_string(),
                    f.count.to_string(),
                ),
                (
                    "the fingerprint",
                    shard.fingerprint.clone(),
                    f.fingerprint.clone(),
                ),
                (
                    "the total case count",
                    shard.total_cases.to_string(),
                    f.total_cases.to_string(),
                ),
            ] {
                if found != expected {
                    return Err(MergeError::Mismatch {
                        file,
                        first: first_file.clone(),
                        what,
                        found,
                        expected,
                    });
                }
            }
        } else {
            first = Some((file.clone(), shard.clone()));
        }
        if let Some((other, _, _)) = shards.get(&shard.index) {
            return Err(MergeError::Duplicate {
                index: shard.index,
                count: shard.count,
                first: other.clone(),
                second: file,
            });
        }
        shards.insert(shard.index, (file, shard, cases));
    }
    let Some((_, reference)) = first else {
        return Err(MergeError::NotAReport {
            file: "(none)".into(),
            why: "no report given".into(),
        });
    };
    if let Some(missing) = (1..=reference.count).find(|k| !shards.contains_key(k)) {
        let given: Vec<String> = shards
            .keys()
            .map(|k| format!("{k}/{}", reference.count))
            .collect();
        return Err(MergeError::Missing {
            missing,
            count: reference.count,
            given: given.join(", "),
        });
    }
    let mut slots: Vec<Option<Value>> = vec![None; reference.total_cases];
    for (file, _, cases) in shards.into_values() {
        for mut case in cases {
            let index = case
                .get("index")
                .and_then(Value::as_u64)
                .unwrap_or(u64::MAX);
            let slot = usize::try_from(index).ok().and_then(|i| slots.get_mut(i));
            match slot {
                Some(slot @ None) => {
                    if let Some(obj) = case.as_object_mut() {
                        obj.remove("index");
                    }
                    *slot = Some(case);
                }
                _ => {
                    return Err(MergeError::BadIndex {
                        file,
                        index,
                        total: reference.total_cases,
                    })
                }
            }
        }
    }
    if let Some(index) = slots.iter().position(Option::is_none) {
        return Err(MergeError::BadIndex {
            file: "(all shards)".into(),
            index: index as u64,
            total: reference.total_cases,
        });
    }
    let cases: Vec<Value> = slots.into_iter().flatten().collect();
    let passed = cases
        .iter()
        .filter(|c| c.get("passed").and_then(Value::as_bool) == Some(true))
        .count();
    let failed = cases.len() - passed;
    let merged = json!({
        "schema": SWEEP_SCHEMA,
        "summary": {"cases": cases.len(), "passed": passed, "failed": failed},
        "cases": cases,
    });
    let text = serde_json::to_string_pretty(&merged).unwrap_or_default();
    Ok((text, if failed > 0 { EXIT_FAILED } else { EXIT_OK }))
}

/// The `kvgeom report merge` command.
pub fn report_merge(files: &[PathBuf], out: Option<&std::path::Path>) -> u8 {
    match merge(files) {
        Ok((text, code)) => {
            match out {
                Some(path) => {
                    if let Err(e) = std::fs::write(path, &text) {
                        eprintln!("error: cannot write {}: {e}", path.display());
                        return EXIT_BAD_INPUT;
                    }
                }
                None => println!("{text}"),
            }
            code
        }
        Err(e) => {
            eprintln!("error: {e}");
            EXIT_BAD_INPUT
        }
    }
}
