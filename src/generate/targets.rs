//! The bodies of the fuzz targets in `fuzz/fuzz_targets/`, shared with the
//! replay test `tests/connector/regressions.rs`. Each takes one input and panics with a
//! readable message when it finds a problem; anything else returns quietly.

use std::path::Path;

use crate::connector::Policy;
use crate::defects::Defect;
use crate::geometry::{parse_geometry, to_toml};
use crate::trace::{check::check_case, parse_trace, TraceCase};

use super::{GeneratedCase, PlanInput};

/// Environment variable naming a defect (`kvgeom defects` lists them) that
/// the `scenario` and `plan` targets run instead of the correct connector.
pub const DEFECT_ENV: &str = "KVGEOM_FUZZ_DEFECT";

/// Why [`DEFECT_ENV`] names no usable defect.
#[derive(Debug, thiserror::Error)]
pub enum DefectEnvError {
    /// The variable is set but is not valid Unicode.
    #[error("{DEFECT_ENV}: {0}")]
    Unreadable(#[source] std::env::VarError),
    /// The variable names no defect of [`Defect::ALL`].
    #[error("{DEFECT_ENV}={name} is not a known defect; one of: {known}")]
    Unknown {
        /// The value of the variable.
        name: String,
        /// Every known defect name, comma separated.
        known: String,
    },
}

/// The defect named by [`DEFECT_ENV`], if set.
pub fn defect_from_env() -> Result<Option<Defect>, DefectEnvError> {
    match std::env::var(DEFECT_ENV) {
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(e) => Err(DefectEnvError::Unreadable(e)),
        Ok(name) if name.is_empty() => Ok(None),
        Ok(name) => Defect::from_name(&name).map(Some).ok_or_else(|| {
            let known: Vec<&str> = Defect::ALL.iter().map(|d| d.name()).collect();
            DefectEnvError::Unknown {
                name,
                known: known.join(", "),
            }
        }),
    }
}

/// `scenario`: the generated case must behave as expected (every oracle
/// passes, or the expected rejection); with `defect`, a finding means the
/// defect was caught.
pub fn scenario(input: &GeneratedCase, defect: Option<Defect>) {
    if let Err(finding) = input.check(defect) {
        let with = defect.map_or(String::new(), |d| format!(" (connector with defect {d})"));
        panic!("scenario finding{with}: {finding}\n{input:?}");
    }
}

/// `geometry_file`: arbitrary text through the TOML loader gives an error
/// or a geometry, and a geometry survives `to_toml` unchanged.
pub fn geometry_file(bytes: &[u8]) {
    let text = String::from_utf8_lossy(bytes);
    let Ok(geometry) = parse_geometry("fuzz.toml", &text) else {
        return;
    };
    let written = to_toml(&geometry);
    match parse_geometry("fuzz.toml", &written) {
        Ok(again) if again == geometry => {}
        Ok(again) => panic!(
            "to_toml does not round-trip:\n--- input ---\n{text}\n--- written ---\n{written}\n--- parsed ---\n{again:?}"
        ),
        Err(e) => panic!(
            "to_toml writes a file the loader refuses: {e}\n--- input ---\n{text}\n--- written ---\n{written}"
        ),
    }
}

/// `trace`: arbitrary bytes through the trace reader, case extraction and
/// the descriptor-level check give an error or a result.
pub fn trace(bytes: &[u8]) {
    let path = Path::new("fuzz.jsonl");
    let Ok(lines) = parse_trace(path, bytes) else {
        return;
    };
    let Ok(case) = TraceCase::from_lines(path, &lines) else {
        return;
    };
    let _ = check_case(&case);
}

/// `plan`: the connector's planner, on arbitrary requests, never addresses
/// a row outside its descriptor list and pairs every attention entry with
/// the same token; with `defect`, a finding means the defect was caught.
pub fn plan(input: &PlanInput, defect: Option<Defect>) {
    let policy = defect.map_or_else(Policy::default, Defect::policy);
    if let Err(finding) = input.check(&policy) {
        let with = defect.map_or(String::new(), |d| format!(" (connector with defect {d})"));
        panic!("plan finding{with}: {finding}\n{input:?}");
    }
}
