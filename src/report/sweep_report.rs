//! A sweep's results as a terminal table, JSON or JUnit XML.

use std::fmt::Write;

use serde::Serialize;

use super::junit::{JunitCase, JunitFailure};
use crate::scenario::CaseReport;
use crate::sweep::shard::Shard;
use crate::under_test::CodeUnderTest;

/// Output format of `kvgeom sweep`.
// The variants' doc comments would become `--help` text: a table on the
// terminal, the JSON report, JUnit XML.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
#[allow(missing_docs)]
pub enum Format {
    Table,
    Json,
    Junit,
}

#[derive(Serialize)]
struct Summary {
    cases: usize,
    passed: usize,
    failed: usize,
    /// Cases vLLM's scheduler cannot make: neither passed nor failed
    /// (omitted when none).
    #[serde(skip_serializing_if = "is_zero")]
    not_reachable: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

#[derive(Serialize)]
struct JsonViolation<'a> {
    oracle: &'a str,
    region: Option<u32>,
    local_block: Option<u32>,
    bytes: u64,
    message: String,
}

#[derive(Serialize)]
struct JsonCase<'a> {
    /// Position in the whole sweep (sharded reports only).
    #[serde(skip_serializing_if = "Option::is_none")]
    index: Option<usize>,
    geometry: &'a str,
    file: Option<String>,
    prompt_len: u32,
    prefix_hit: u32,
    mode: &'a str,
    allocation: &'a str,
    seed: u64,
    policy: &'a str,
    defect: Option<&'a str>,
    passed: bool,
    outcome: &'a crate::scenario::Outcome,
    stats: crate::scenario::Stats,
    violations: Vec<JsonViolation<'a>>,
    code_under_test: &'a CodeUnderTest,
}

/// The `schema` of the JSON sweep report (docs/report-format.md).
pub const SWEEP_SCHEMA: &str = "kvgeom-sweep/1";

#[derive(Serialize)]
struct JsonReport<'a> {
    schema: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    shard: Option<&'a Shard>,
    /// What ran the sweep (each case has it too).
    code_under_test: &'a CodeUnderTest,
    summary: Summary,
    cases: Vec<JsonCase<'a>>,
}

fn summary(reports: &[CaseReport]) -> Summary {
    let passed = reports.iter().filter(|r| r.passed()).count();
    let not_reachable = reports.iter().filter(|r| r.outcome.not_reachable()).count();
    Summary {
        cases: reports.len(),
        passed,
        failed: reports.len() - passed - not_reachable,
        not_reachable,
    }
}

/// The JSON document of a sweep or of one shard of it (`positions` holds
/// each report's position in the whole sweep) that `code` ran.
pub fn json(
    reports: &[CaseReport],
    shard: Option<(&Shard, &[usize])>,
    code: &CodeUnderTest,
) -> String {
    let cases = reports
        .iter()
        .enumerate()
        .map(|(i, r)| JsonCase {
            index: shard.and_then(|(_, positions)| positions.get(i).copied()),
            geometry: r.case.geometry_name(),
            file: r.case.file.as_ref().map(|f| f.display().to_string()),
            prompt_len: r.case.prompt_len,
            prefix_hit: r.case.prefix_hit,
            mode: r.case.mode.as_str(),
            allocation: r.case.allocation.as_str(),
            seed: r.case.seed,
            policy: r.case.variant.named_policy().name(),
            defect: r.case.variant.defect().map(|d| d.name()),
            passed: r.passed(),
            outcome: &r.outcome,
            stats: r.stats,
            violations: r
                .violations
                .iter()
                .map(|v| JsonViolation {
                    oracle: v.oracle,
                    region: v.region,
                    local_block: v.local_block,
                    bytes: v.bytes,
                    message: v.to_string(),
                })
                .collect(),
            code_under_test: code,
        })
        .collect();
    serde_json::to_string_pretty(&JsonReport {
        schema: SWEEP_SCHEMA,
        shard: shard.map(|(s, _)| s),
        code_under_test: code,
        summary: summary(reports),
        cases,
    })
    .unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}

/// JUnit XML: one testsuite per geometry, one testcase per case; a shard's
/// report (`positions` as for [`json`]) adds the shard's properties, and
/// every report the `kvgeom.code_under_test.*` properties of `code` (what ran).
pub fn junit(
    reports: &[CaseReport],
    shard: Option<(&Shard, &[usize])>,
    code: &CodeUnderTest,
) -> String {
    let cases: Vec<JunitCase> = reports
        .iter()
        .map(|r| {
            let c = &r.case;
            let failure = r.failed().then(|| {
                let mut text =
                    format!("{}\nreplay: {}\n", r.outcome.describe(), c.replay_command());
                for v in r.violations.iter().take(20) {
                    let _ = writeln!(text, "{v}");
                }
                JunitFailure {
                    message: r.outcome.describe(),
                    text,
                }
            });
            JunitCase {
                suite: c.geometry_name().to_string(),
                name: c.label_in_geometry(),
                failure,
            }
        })
        .collect();
    let code = super::junit::code_properties(code);
    super::junit::write(&cases, shard, &code)
}

/// The terminal table: one line per geometry and mode, then each failure.
pub fn table(reports: &[CaseReport]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<44} {:<5} {:>6} {:>6} {:>6} {:>10} {:>12}",
        "geometry", "mode", "cases", "passed", "failed", "pairs", "bytes"
    );
    let mut keys: Vec<(&str, &str)> = reports
        .iter()
        .map(|r| (r.case.geometry_name(), r.case.mode.as_str()))
        .collect();
    keys.dedup();
    let mut seen = Vec::new();
    for key in keys {
        if seen.contains(&key) {
            continue;
        }
        seen.push(key);
        let mine: Vec<&CaseReport> = reports
            .iter()
            .filter(|r| (r.case.geometry_name(), r.case.mode.as_str()) == key)
            .collect();
        let passed = mine.iter().filter(|r| r.passed()).count();
        let apart = mine.iter().filter(|r| r.outcome.not_reachable()).count();
        let rejected = mine.iter().any(|r| {
            matches!(
                r.outcome,
                crate::scenario::Outcome::ExpectedRejection { .. }
            )
        });
        let rewrites = redundant_writes_note(&mine);
        let _ = writeln!(
            out,
            "{:<44} {:<5} {:>6} {:>6} {:>6} {:>10} {:>12}{}{rewrites}",
            key.0,
            key.1,
            mine.len(),
            passed,
            mine.len() - passed - apart,
            mine.iter().map(|r| r.stats.pairs).sum::<u64>(),
            mine.iter().map(|r| r.stats.transferred_bytes).sum::<u64>(),
            match (rejected, apart) {
                (true, _) => "  (refused as expected)".to_string(),
                (false, 0) => String::new(),
                (false, n) => format!("  ({n} not reachable by vLLM's scheduler)"),
            }
        );
    }
    let s = summary(reports);
    let _ = write!(out, "\n{} passed, {} failed", s.passed, s.failed);
    if s.not_reachable > 0 {
        let _ = write!(
            out,
            ", {} not reachable by vLLM's scheduler (counted apart)",
            s.not_reachable
        );
    }
    out.push('\n');
    out
}

/// `  (2x redundant writes in 9 cases)`: identical rewrites, a cost the
/// passing cases of a geometry and mode carry (empty when none).
fn redundant_writes_note(reports: &[&CaseReport]) -> String {
    let with: Vec<_> = reports
        .iter()
        .filter(|r| r.passed() && !r.stats.redundant_writes.is_none())
        .collect();
    let most = with
        .iter()
        .map(|r| r.stats.redundant_writes.multiplicity)
        .max();
    match most {
        None => String::new(),
        Some(k) => format!(
            "  ({k}x redundant writes in {} case{})",
            with.len(),
            if with.len() == 1 { "" } else { "s" }
        ),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::geometry::{fixtures, Mode};
    use crate::scenario::{Case, CaseReport, Outcome, Stats};
    use crate::scheduler::DecodeAllocation;
    use crate::under_test::CodeUnderTest;
    use crate::variant::Variant;

    fn report(prompt_len: u32, outcome: Outcome) -> CaseReport {
        CaseReport {
            case: Case {
                geometry: Arc::new(fixtures::g1()),
                file: None,
                prompt_len,
                prefix_hit: 0,
                mode: Mode::Pull,
                allocation: DecodeAllocation::Mainline,
                seed: 0,
                variant: Variant::KVGEOM,
            },
            outcome,
            stats: Stats::default(),
            violations: Vec::new(),
        }
    }

    #[test]
    fn cases_vllms_scheduler_cannot_make_are_counted_apart() {
        let reports = vec![
            report(5, Outcome::Passed),
            report(
                6,
                Outcome::NotReachable {
                    reason: "a prefix hit of 8 tokens is not whole decode blocks of 12".into(),
                },
            ),
            report(7, Outcome::error("boom")),
        ];
        let table = super::table(&reports);
        assert!(
            table.contains("(1 not reachable by vLLM's scheduler)"),
            "{table}"
        );
        assert!(
            table.ends_with(
                "1 passed, 1 failed, 1 not reachable by vLLM's scheduler (counted apart)\n"
            ),
            "{table}"
        );
        let doc: serde_json::Value = serde_json::from_str(&super::json(
            &reports,
            None,
            &CodeUnderTest::kvgeom(Variant::KVGEOM),
        ))
        .expect("JSON");
        assert_eq!(
            doc["summary"],
            serde_json::json!({"cases": 3, "passed": 1, "failed": 1, "not_reachable": 1})
        );
        assert_eq!(doc["cases"][1]["outcome"]["kind"], "not_reachable");
        let junit = super::junit(&reports, None, &CodeUnderTest::kvgeom(Variant::KVGEOM));
        assert_eq!(junit.matches("<failure").count(), 1, "{junit}");
        // Without one, the summary is the one it always was.
        let doc: serde_json::Value = serde_json::from_str(&super::json(
            &reports[..1],
            None,
            &CodeUnderTest::kvgeom(Variant::KVGEOM),
        ))
        .expect("JSON");
        assert_eq!(
            doc["summary"],
            serde_json::json!({"cases": 1, "passed": 1, "failed": 0})
        );
    }
}
