//! Writing kvgeom's own run of a case as a recorded trace (`kvgeom-trace/3`,
//! docs/trace-format.md): the run record serialised in the layout the live
//! driver's v2 traces use (the case as the driver would be given it, the
//! connector's registrations, lists, transfers and receive post-process
//! calls as a driver's result, each region's memory before and after),
//! plus what ran (`code_under_test`). `check-trace`, `diff-trace` and
//! `sweep --connector replay` read it as they read a v2 trace.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use super::base64;
use crate::driver::TRACE_MEMORY_LIMIT;
use crate::layout::Side;
use crate::live::protocol::{CaseResult, RESULT_FORMAT};
use crate::live::run::spec_without_memory;
use crate::oracle::{BeforeImage, RankMemory};
use crate::pattern::InitialFill;
use crate::scenario::{shape_and_place, CaseRun, Outcome};
use crate::under_test::{CodeUnderTest, ConnectorLog};

/// The `format` of a trace that records its code under test.
pub const TRACE_FORMAT_V3: &str = "kvgeom-trace/3";

/// Why a run cannot be written as a trace.
#[derive(Debug, thiserror::Error)]
pub enum TraceWriteError {
    /// kvgeom cannot prepare the case again (the trace's case and initial
    /// memory are its preparation).
    #[error("{path}: kvgeom cannot prepare the case: {reason}", path = path.display())]
    Prepare {
        /// The trace that was to be written.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The file cannot be written.
    #[error("{path}: {source}", path = path.display())]
    Write {
        /// The trace.
        path: PathBuf,
        /// The write's error.
        #[source]
        source: std::io::Error,
    },
}

/// The driver's `status`, `side` and `message` for how kvgeom's run ended
/// (before the geometry's expectations judged it).
fn status_of(outcome: &Outcome) -> (&'static str, Option<Side>, Option<String>) {
    match outcome {
        Outcome::Passed | Outcome::Violations | Outcome::MissingRejection { .. } => {
            ("done", None, None)
        }
        Outcome::UnexpectedRejection { side, message }
        | Outcome::ExpectedRejection { side, message } => {
            ("rejected", Some(*side), Some(message.clone()))
        }
        Outcome::Crashed { side, message } => ("crashed", Some(*side), Some(message.clone())),
        Outcome::Hung { message } => ("hung", None, Some(message.clone())),
        Outcome::Error { message } => ("error", None, Some(message.clone())),
        // kvgeom's own runs are never placed by vLLM's scheduler.
        Outcome::NotReachable { reason } => ("error", None, Some(reason.clone())),
    }
}

/// kvgeom's run as a driver's result: how it ended and its connector log.
fn result_of(run: &CaseRun) -> CaseResult {
    let (status, side, message) = status_of(&run.report.outcome);
    let ConnectorLog {
        regions,
        dlists,
        xfers,
        post_process_calls,
        region_zero_calls,
        handshakes,
    } = ConnectorLog::of_kvgeom(run);
    CaseResult {
        format: RESULT_FORMAT.to_string(),
        status: status.to_string(),
        side: side.map(|s| s.as_str().to_string()),
        message,
        regions,
        dlists,
        xfers,
        post_process: Vec::new(),
        post_process_calls,
        region_zero_calls,
        handshakes,
        nixl: None,
        nixl_version: None,
        failures: Vec::new(),
        raised: Vec::new(),
        notifs: Vec::new(),
        trace: None,
        request_path: None,
    }
}

/// Every region's bytes before and after the run, read from the run's own
/// memory (never prepared again): when the case's memory is at most
/// [`TRACE_MEMORY_LIMIT`] and the run left final memory. A rank whose
/// initial image the run did not copy has it recomputed from the harness's
/// fill (at most that limit, once per region written).
fn memory_of(run: &CaseRun) -> Option<Value> {
    let input = run.oracle_input.as_ref()?;
    let case = &input.case;
    let ranks = |side| case.engines(side).len() as u32;
    let total: u64 = [Side::Prefill, Side::Decode]
        .into_iter()
        .flat_map(|side| case.engines(side))
        .map(|e| e.region_len() * u64::from(e.num_regions()))
        .sum();
    if total > TRACE_MEMORY_LIMIT {
        return None;
    }
    let mut images = Vec::new();
    for side in [Side::Prefill, Side::Decode] {
        for rank in 0..ranks(side) {
            let engine = case.engine(side, rank)?;
            let recomputed = |fill: &InitialFill, region: u32| -> Option<Vec<u8>> {
                let mut bytes = vec![0u8; usize::try_from(engine.region_len()).ok()?];
                fill.fill_region(case, region, &mut bytes).ok()?;
                Some(bytes)
            };
            for region in 0..engine.num_regions() {
                let (before, after): (std::borrow::Cow<[u8]>, Option<&[u8]>) =
                    match input.rank_memory(side, rank)? {
                        RankMemory::Images(m) => {
                            let before = match &m.before {
                                BeforeImage::Copied(copies) => std::borrow::Cow::Borrowed(
                                    copies.get(region as usize)?.as_slice(),
                                ),
                                BeforeImage::Recomputed(fill) => {
                                    std::borrow::Cow::Owned(recomputed(fill, region)?)
                                }
                            };
                            (before, Some(&m.after.get(region as usize)?[..]))
                        }
                        RankMemory::Untouched(fill) => {
                            (std::borrow::Cow::Owned(recomputed(fill, region)?), None)
                        }
                    };
                let after = after.unwrap_or(&before);
                images.push(json!({
                    "agent": side.agent_name(rank),
                    "region": region,
                    "before": base64::encode(&before),
                    "after": base64::encode(after),
                }));
            }
        }
    }
    Some(json!({ "encoding": "base64", "images": images }))
}

/// kvgeom's run of a case (`run_case_detailed`'s) as a trace: its JSON.
pub fn trace_of(
    run: &CaseRun,
    code: &CodeUnderTest,
    path: &Path,
) -> Result<Value, TraceWriteError> {
    let case = &run.report.case;
    let id = crate::driver::trace_file_name(case);
    let placed = match (&run.shape, &run.placement) {
        (Some(shape), Some(placement)) => Ok((shape.clone(), placement.clone())),
        _ => shape_and_place(case),
    };
    let spec = spec_without_memory(case, placed, &id).map_err(|o| TraceWriteError::Prepare {
        path: path.to_path_buf(),
        reason: o.describe(),
    })?;
    let mut spec = serde_json::to_value(&spec).unwrap_or(Value::Null);
    if let Some(map) = spec.as_object_mut() {
        map.remove("dir");
    }
    let mut trace = json!({
        "format": TRACE_FORMAT_V3,
        "code_under_test": code,
        "case": spec,
        "result": result_of(run),
    });
    if let Some(memory) = memory_of(run) {
        trace["memory"] = memory;
    }
    Ok(trace)
}

/// Write kvgeom's run of a case as a trace at `path` (gzipped when the name
/// ends in `.gz`).
pub fn write_trace(
    run: &CaseRun,
    code: &CodeUnderTest,
    path: &Path,
) -> Result<(), TraceWriteError> {
    let text = trace_of(run, code, path)?.to_string();
    crate::trace::text_file::write_trace_text(path, &text).map_err(|source| {
        TraceWriteError::Write {
            path: path.to_path_buf(),
            source,
        }
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::Value;

    use super::{result_of, trace_of};
    use crate::driver::TRACE_MEMORY_LIMIT;
    use crate::geometry::{load_geometry, Mode};
    use crate::layout::Side;
    use crate::live::run::{prepare, side_index};
    use crate::scenario::{Case, RunOptions};
    use crate::scheduler::DecodeAllocation;
    use crate::trace::base64;
    use crate::under_test::{run_case_detailed, CodeUnderTest};
    use crate::variant::Variant;

    fn case(file: &str, prompt_len: u32, prefix_hit: u32, mode: Mode) -> Case {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("geometries")
            .join(file);
        Case {
            geometry: Arc::new(load_geometry(&path).expect("geometry")),
            file: Some(path),
            prompt_len,
            prefix_hit,
            mode,
            allocation: DecodeAllocation::Mainline,
            seed: 3,
            variant: Variant::KVGEOM,
        }
    }

    /// The trace of kvgeom's run, written from the run alone, names the case
    /// and holds the initial memory exactly as a second preparation of the
    /// case (what the writer did before) gives them, for pull and push,
    /// attention and hybrids, with and without a prefix hit.
    #[test]
    fn a_trace_is_written_from_the_run_as_a_second_preparation_would_write_it() {
        let mut written = 0;
        let cases = [
            case("llama-gqa-prefix-cache.toml", 37, 16, Mode::Pull),
            case("mla-kda-decode-tp2.toml", 13, 0, Mode::Pull),
            case("mla-kda-equal-ppl-prefix-cache.toml", 37, 16, Mode::Push),
            case("qwen3-next-gqa-gdn-decode-tp2.toml", 9, 0, Mode::Push),
            case("deepseek-mla.toml", 65, 0, Mode::Pull),
        ];
        for case in cases {
            let label = format!("{} {}", case.geometry_name(), case.mode);
            let run = run_case_detailed(&case, &RunOptions::default());
            let trace = trace_of(
                &run,
                &CodeUnderTest::kvgeom(case.variant),
                std::path::Path::new("t.trace.json"),
            )
            .expect("written");
            let prepared =
                prepare(&case, &crate::driver::trace_file_name(&case)).expect("prepared");
            let mut spec = serde_json::to_value(&prepared.spec).expect("spec");
            spec.as_object_mut().expect("object").remove("dir");
            assert_eq!(trace["case"], spec, "{label}");
            let result = result_of(&run);
            assert!(!result.handshakes.is_empty(), "{label}");
            assert!(result.handshakes.iter().all(|h| h.ok), "{label}");
            if prepared.memory_bytes() > TRACE_MEMORY_LIMIT {
                assert!(trace.get("memory").is_none(), "{label}");
                continue;
            }
            let images = trace["memory"]["images"].as_array().expect("images");
            let mut compared = 0;
            for side in [Side::Prefill, Side::Decode] {
                for (rank, regions) in prepared.before[side_index(side)].iter().enumerate() {
                    let agent = side.agent_name(rank as u32);
                    for (region, before) in regions.iter().enumerate() {
                        let image = images
                            .iter()
                            .find(|i| i["agent"] == agent.as_str() && i["region"] == region)
                            .unwrap_or_else(|| panic!("{label}: {agent} r{region}"));
                        let Value::String(text) = &image["before"] else {
                            panic!("{label}: no before image")
                        };
                        let decoded = base64::decode(text).expect("base64");
                        assert!(&decoded == before, "{label}: {agent} r{region}");
                        compared += 1;
                    }
                }
            }
            assert_eq!(compared, images.len(), "{label}");
            written += 1;
        }
        assert_eq!(written, 4, "cases whose memory the trace holds");
    }

    /// A refused handshake is in the record with its reason.
    #[test]
    fn a_refused_handshake_is_recorded_with_its_reason() {
        let case = case("reject-gqa-nhd-replicated-heads.toml", 4, 0, Mode::Pull);
        let case = Case {
            variant: Variant::Policy(crate::connector::NamedPolicy::Kvgeom),
            ..case
        };
        let run = run_case_detailed(&case, &RunOptions::default());
        let refused: Vec<_> = result_of(&run)
            .handshakes
            .into_iter()
            .filter(|h| !h.ok)
            .collect();
        assert_eq!(refused.len(), 1, "{:?}", run.report.outcome);
        assert!(refused[0].message.as_deref().is_some_and(|m| run
            .report
            .outcome
            .describe()
            .contains(m)));
    }
}
