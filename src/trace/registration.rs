//! Whether kvgeom's model of a v1 trace is the traced model: the model is
//! rebuilt from the trace's sizes (MLA attention, KDA state), so it is the
//! traced one only if its worker registers vLLM's own list (the trace's
//! first: every attention page, conv sub-projection and state row of
//! decode's regions). Another mamba kind or split registers other rows;
//! such a trace is refused rather than judged on the wrong model.

use super::case::TraceCase;
use super::diff::{diff_run, Difference};
use super::replay::replay;
use crate::defects::{policy_with, Defect};

/// kvgeom's model of the traced sizes registers another list than vLLM's.
#[derive(Debug, thiserror::Error)]
#[error(
    "{case}: refused: the model kvgeom rebuilds from the trace's sizes (MLA attention, KDA \
     state) registers another list than vLLM's own ({difference}), so it is not the traced \
     model; record a v2 trace of the geometry instead (`kvgeom sweep --connector vllm \
     GEOMETRY --record-traces DIR`, docs/trace-format.md \"Recording\")"
)]
pub struct NotTheTracedModel {
    /// The trace case's name.
    pub case: String,
    /// The first difference in the registration list.
    pub difference: String,
}

/// `Ok` when kvgeom's model of the traced vLLM release (its known defects:
/// for vLLM 0.33.0, `--policy vllm-0.33.0`) registers the trace's first list. A rebuild the connector refuses says nothing here
/// (the commands report that refusal, or judge on the sizes alone).
pub fn registration_is_modelled(case: &TraceCase) -> Result<(), NotTheTracedModel> {
    let model = policy_with(&Defect::of_vllm(&case.meta.vllm));
    let Ok(run) = replay(case, model) else {
        return Ok(());
    };
    match diff_run(case, run.recording.events(), &run.actual).difference() {
        Some(
            d @ (Difference::LocalRegionCount { .. }
            | Difference::DlistRow { list: 0, .. }
            | Difference::DlistRowCount { list: 0, .. }),
        ) => Err(NotTheTracedModel {
            case: case.name.clone(),
            difference: d.to_string(),
        }),
        _ => Ok(()),
    }
}
