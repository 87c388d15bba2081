//! The fields of a v1 trace whose value would change the verdict in a way
//! kvgeom does not model: a trace carrying one is refused, naming the field
//! and what to do instead, never judged on a model of another case.
//! docs/trace-format.md ("v1 fields") lists every field of every event as
//! modelled, refused when not at its default, or informational; this file
//! is the refused column.

use std::collections::BTreeMap;

use serde_json::Value;

use super::case::TraceCase;
use super::error::{Disagreement, Refusal, TraceErrorKind};
use crate::nixl::XferOp;

/// The way forward for a geometry the live mode runs.
const RECORD_V2: &str = "record a v2 trace of the geometry instead (`kvgeom sweep --connector \
                         vllm GEOMETRY --record-traces DIR`, docs/trace-format.md \"Recording\")";

/// The way forward for what neither trace format models.
const NOT_JUDGED: &str =
    "neither trace format models it, so kvgeom gives no verdict; check such a \
                          case with vLLM's own unit-test invariants instead";

/// The worker class whose pull reads kvgeom replays.
const PULL_WORKER: &str = "NixlPullConnectorWorker";

/// The KV layouts kvgeom reads as token-major pages.
const TOKEN_MAJOR_LAYOUTS: [&str; 2] = ["LBNHC", "NHD"];

/// `meta.params` keys and what they are: every other key is refused.
pub const PARAM_KEYS: [&str; 13] = [
    "num_tokens",
    "local_block",
    "remote_block",
    "cached",
    "alloc",
    "d_rank",
    "d_tp",
    "p_tp",
    "prefix_hit",
    "geometry",
    "seed",
    "kernel",
    "groups",
];

/// The decode allocation models `meta.params.alloc` may name.
pub const ALLOCATIONS: [&str; 2] = ["mainline", "with-last-token"];

/// `local_geometry.geometry` attributes outside the typed ones that are
/// checked here or informational; any other attribute not at its default
/// (null, false, 0, empty) is refused.
const KNOWN_GEOMETRY_EXTRAS: [&str; 9] = [
    "dcp_size",
    "pcp_size",
    "pp_size",
    "_is_csa_linear",
    "region_group_ids",
    "_transfer_layer_region_indices",
    "_transfer_layer_group_ids",
    "_scratch_region_indices",
    "_ple_group_index",
];

/// Remote metadata fields outside the typed ones that are checked here or
/// informational.
const KNOWN_REMOTE_EXTRAS: [&str; 6] = [
    "region_group_ids",
    "region_names",
    "ple_block_len",
    "region_members",
    "packed_member_layouts",
    "cp_kv_cache_interleave_size",
];

fn refused(
    ev: &'static str,
    field: impl Into<String>,
    value: impl std::fmt::Display,
    why: impl Into<String>,
    instead: &str,
) -> TraceErrorKind {
    TraceErrorKind::NotModelled(Box::new(Refusal {
        ev,
        field: field.into(),
        value: value.to_string(),
        why: why.into(),
        instead: instead.to_string(),
    }))
}

/// A JSON value at its default: null, false, 0, an empty string, list or object.
fn is_default(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
    }
}

/// A size that must be 1 (absent counts as 1).
fn must_be_one(
    ev: &'static str,
    field: &str,
    value: Option<&Value>,
    what: &str,
) -> Result<(), TraceErrorKind> {
    match value {
        None | Some(Value::Null) => Ok(()),
        Some(v) if v.as_u64() == Some(1) => Ok(()),
        Some(v) => Err(refused(
            ev,
            field,
            v,
            format!("kvgeom models {what} 1 only"),
            NOT_JUDGED,
        )),
    }
}

/// What a `dcp_size` field sizes.
const DCP: &str = "decode context parallel size";

/// A typed size that must be 1.
fn one(ev: &'static str, field: &str, value: u32, what: &str) -> Result<(), TraceErrorKind> {
    must_be_one(ev, field, Some(&Value::from(value)), what)
}

/// The first field of `other` that is neither known nor at its default.
fn unknown_extra(
    ev: &'static str,
    prefix: &str,
    other: &BTreeMap<String, Value>,
    known: &[&str],
) -> Result<(), TraceErrorKind> {
    match other
        .iter()
        .find(|(k, v)| !known.contains(&k.as_str()) && !is_default(v))
    {
        Some((k, v)) => Err(refused(
            ev,
            format!("{prefix}{k}"),
            v,
            "kvgeom does not know this attribute, so it cannot tell whether it changes the transfer",
            NOT_JUDGED,
        )),
        None => Ok(()),
    }
}

/// The model kvgeom's v1 reader rebuilds: MLA attention, and the KV-cache
/// groups in its order. Refused before the counts are checked, since those
/// checks read the trace on that model (a GQA or mamba-first trace is
/// refused as such, not as an inconsistent one).
pub fn refuse_unmodelled_model(case: &TraceCase) -> Result<(), TraceErrorKind> {
    if !case.local_geometry.use_mla {
        return Err(refused(
            "local_geometry",
            "geometry.use_mla",
            false,
            "kvgeom judges v1 traces of MLA attention only (GQA pages are not rebuilt from a v1 trace)",
            RECORD_V2,
        ));
    }
    groups(case)
}

/// The first field of `case` that kvgeom does not model at its value
/// (after [`refuse_unmodelled_model`] and the counts).
pub fn refuse_unmodelled(case: &TraceCase) -> Result<(), TraceErrorKind> {
    params(case)?;
    if let Some(args) = &case.case_args {
        one("case", "args.remote_dcp_size", args.remote_dcp_size, DCP)?;
        one("case", "args.local_dcp_size", args.local_dcp_size, DCP)?;
    }
    one("make_worker", "args.dcp_size", case.worker.dcp_size, DCP)?;
    local_geometry(case)?;
    for remote in &case.remotes {
        remote_rank(case, remote)?;
    }
    request(case)?;
    if let Some(x) = case.xfers.iter().find(|x| x.op != XferOp::Read) {
        return Err(refused(
            "xfer",
            "op",
            serde_json::to_value(x.op).unwrap_or_default(),
            "v1 traces are decode's pull reads; kvgeom does not replay a push from them",
            RECORD_V2,
        ));
    }
    Ok(())
}

fn params(case: &TraceCase) -> Result<(), TraceErrorKind> {
    let params = &case.meta.params;
    if let Some((key, value)) = params
        .iter()
        .find(|(k, _)| !PARAM_KEYS.contains(&k.as_str()))
    {
        return Err(refused(
            "meta",
            format!("params.{key}"),
            value,
            format!(
                "an unknown test parameter may select a case kvgeom does not model (known: {})",
                PARAM_KEYS.join(", ")
            ),
            NOT_JUDGED,
        ));
    }
    if let Some(alloc) = params.get("alloc") {
        if !alloc.as_str().is_some_and(|a| ALLOCATIONS.contains(&a)) {
            return Err(refused(
                "meta",
                "params.alloc",
                alloc,
                format!(
                    "kvgeom models the decode allocations {}",
                    ALLOCATIONS.join(" and ")
                ),
                NOT_JUDGED,
            ));
        }
    }
    Ok(())
}

/// `meta.params.groups`, the model's KV-cache groups by kind, is the case
/// the rest of the file registers: one kind per group of the request,
/// mamba among them exactly when the worker has mamba state, and in the
/// order the v1 reader models (the attention group first, mamba after it).
fn groups(case: &TraceCase) -> Result<(), TraceErrorKind> {
    const EV: &str = "meta";
    const FIELD: &str = "params.groups";
    let Some(value) = case.meta.params.get("groups") else {
        return Ok(());
    };
    let kinds: Option<Vec<&str>> = value
        .as_array()
        .and_then(|a| a.iter().map(Value::as_str).collect());
    let Some(kinds) = kinds.filter(|k| k.iter().all(|k| ["attention", "mamba"].contains(k))) else {
        return Err(refused(
            EV,
            FIELD,
            value,
            "kvgeom's v1 reader models KV-cache groups of the kinds attention and mamba only",
            NOT_JUDGED,
        ));
    };
    let disagree = |expected: String| {
        TraceErrorKind::Inconsistent(Box::new(Disagreement {
            ev: EV,
            field: FIELD.to_string(),
            value: value.to_string(),
            expected,
        }))
    };
    let requested = case.request.blocks.local_block_ids.len();
    if kinds.len() != requested {
        return Err(disagree(format!(
            "one kind per KV-cache group, and request local_block_ids has {requested} groups"
        )));
    }
    let has_mamba = case.local_geometry.has_mamba;
    if kinds.contains(&"mamba") != has_mamba {
        return Err(disagree(format!(
            "mamba among the groups exactly when the worker has mamba state, and \
             local_geometry geometry._has_mamba is {has_mamba}"
        )));
    }
    if kinds.first() != Some(&"attention") || kinds.iter().skip(1).any(|k| *k == "attention") {
        return Err(refused(
            EV,
            FIELD,
            value,
            "kvgeom's v1 reader models one attention group, the request's first, with \
             mamba groups after it",
            RECORD_V2,
        ));
    }
    Ok(())
}

fn local_geometry(case: &TraceCase) -> Result<(), TraceErrorKind> {
    const EV: &str = "local_geometry";
    let g = &case.local_geometry;
    if case.worker_class != PULL_WORKER {
        return Err(refused(
            EV,
            "worker_cls",
            Value::from(case.worker_class.as_str()),
            format!("kvgeom replays v1 traces of vLLM's {PULL_WORKER} only"),
            RECORD_V2,
        ));
    }
    for (field, what) in [
        ("dcp_size", "decode context parallel size"),
        ("pcp_size", "prefill context parallel size"),
        ("pp_size", "pipeline parallel size"),
    ] {
        must_be_one(EV, &format!("geometry.{field}"), g.other.get(field), what)?;
    }
    let nondefault = |field: &str| g.other.get(field).filter(|v| !is_default(v));
    for (field, why) in [
        ("_is_csa_linear", "CSA linear attention is not modelled"),
        (
            "_transfer_layer_region_indices",
            "transfer layers (regions outside the KV-cache groups) are not modelled",
        ),
        (
            "_transfer_layer_group_ids",
            "transfer layers (regions outside the KV-cache groups) are not modelled",
        ),
        (
            "_scratch_region_indices",
            "scratch regions are not modelled",
        ),
    ] {
        if let Some(v) = nondefault(field) {
            return Err(refused(EV, format!("geometry.{field}"), v, why, NOT_JUDGED));
        }
    }
    // A group index: 0 is a group, only null is none.
    if let Some(v) = g.other.get("_ple_group_index").filter(|v| !v.is_null()) {
        return Err(refused(
            EV,
            "geometry._ple_group_index",
            v,
            "a per-layer-embedding group is not modelled",
            NOT_JUDGED,
        ));
    }
    shared_regions(
        EV,
        "geometry.",
        &g.other,
        case.request.blocks.local_block_ids.len(),
    )?;
    unknown_extra(EV, "geometry.", &g.other, &KNOWN_GEOMETRY_EXTRAS)?;
    layout(EV, "geometry.kv_cache_layout", &g.kv_cache_layout)?;
    if g.use_host_buffer {
        return Err(refused(
            EV,
            "geometry.use_host_buffer",
            true,
            "staging through host buffers is not modelled for v1 traces",
            RECORD_V2,
        ));
    }
    if let Some(i) = g.region_is_mla.iter().position(|m| !m) {
        return Err(refused(
            EV,
            format!("geometry._region_is_mla[{i}]"),
            false,
            "a non-MLA region beside MLA attention is not modelled",
            RECORD_V2,
        ));
    }
    uniform(EV, "geometry.block_len_per_layer", &g.block_len_per_layer)?;
    if g.block_stride_per_layer != g.block_len_per_layer {
        return Err(refused(
            EV,
            "geometry.block_stride_per_layer",
            Value::from(g.block_stride_per_layer.clone()),
            "blocks padded past their length (strides other than block_len_per_layer) are not modelled",
            NOT_JUDGED,
        ));
    }
    if let Some(i) = g.region_num_blocks.iter().position(|&n| n != g.num_blocks) {
        return Err(refused(
            EV,
            format!("geometry.region_num_blocks[{i}]"),
            g.region_num_blocks[i],
            format!(
                "regions with other block counts than num_blocks ({}) are not modelled",
                g.num_blocks
            ),
            NOT_JUDGED,
        ));
    }
    Ok(())
}

/// Region group ids (`region_group_ids` of `other`, the extra fields
/// under `prefix`), when given, must all be -1: every region shared by the
/// KV-cache groups, as the model lays them out. With one KV-cache group
/// (`groups`, the request's), every region tied to group 0 is the same
/// layout: the only group owns every region.
fn shared_regions(
    ev: &'static str,
    prefix: &str,
    other: &BTreeMap<String, Value>,
    groups: usize,
) -> Result<(), TraceErrorKind> {
    let field = "region_group_ids";
    let Some(v) = other.get(field).filter(|v| !v.is_null()) else {
        return Ok(());
    };
    let all_shared = v.as_array().is_some_and(|ids| {
        ids.iter().all(|id| id.as_i64() == Some(-1))
            || (groups == 1 && ids.iter().all(|id| id.as_i64() == Some(0)))
    });
    if all_shared {
        return Ok(());
    }
    Err(refused(
        ev,
        format!("{prefix}{field}"),
        v,
        "regions tied to single KV-cache groups are not modelled (every region must be shared, -1, \
         or, with one KV-cache group, all 0)",
        NOT_JUDGED,
    ))
}

/// Every region's block length must be the same (the model has one page).
fn uniform(ev: &'static str, field: &str, lens: &[u64]) -> Result<(), TraceErrorKind> {
    match lens.iter().position(|l| Some(l) != lens.first()) {
        Some(i) => Err(refused(
            ev,
            format!("{field}[{i}]"),
            lens[i],
            format!(
                "regions of different block lengths are not modelled (region 0 has {})",
                lens[0]
            ),
            NOT_JUDGED,
        )),
        None => Ok(()),
    }
}

fn layout(ev: &'static str, field: &str, name: &str) -> Result<(), TraceErrorKind> {
    if TOKEN_MAJOR_LAYOUTS.contains(&name) {
        return Ok(());
    }
    Err(refused(
        ev,
        field,
        Value::from(name),
        format!(
            "kvgeom reads v1 traces in the token-major layouts {} only",
            TOKEN_MAJOR_LAYOUTS.join(" and ")
        ),
        RECORD_V2,
    ))
}

fn remote_rank(case: &TraceCase, remote: &super::case::RemoteRank) -> Result<(), TraceErrorKind> {
    const EV: &str = "add_remote_agent";
    one(EV, "args.remote_dcp_size", remote.dcp_size, DCP)?;
    let m = &remote.meta;
    must_be_one(
        EV,
        "remote_meta.dcp_size",
        m.dcp_size.map(Value::from).as_ref(),
        "decode context parallel size",
    )?;
    must_be_one(
        EV,
        "remote_meta.pcp_size",
        m.pcp_size.map(Value::from).as_ref(),
        "prefill context parallel size",
    )?;
    layout(EV, "remote_meta.kv_cache_layout", &m.kv_cache_layout)?;
    uniform(EV, "remote_meta.block_lens", &m.block_lens)?;
    // A kernel ratio: one side's kernel block a whole number of the other's.
    let (local_kernel, remote_kernel) = (case.worker.kernel_block_size, m.block_size);
    if local_kernel % remote_kernel != 0 && remote_kernel % local_kernel != 0 {
        return Err(refused(
            EV,
            "remote_meta.block_size",
            remote_kernel,
            format!(
                "kernel blocks of {remote_kernel} and decode's {local_kernel} tokens are not a \
                 whole-number ratio, which kvgeom does not model"
            ),
            NOT_JUDGED,
        ));
    }
    // Prefill's pages are the model's: the same bytes per token as decode's.
    let g = &case.local_geometry;
    let per_token =
        g.block_len_per_layer.first().copied().unwrap_or(0) / u64::from(g.block_size.max(1));
    let page = per_token.saturating_mul(u64::from(m.block_size));
    if let Some(&len) = m.block_lens.first().filter(|&&l| l != page) {
        return Err(refused(
            EV,
            "remote_meta.block_lens",
            Value::from(m.block_lens.clone()),
            format!(
                "prefill pages of other bytes per token than decode's are not modelled \
                 (decode's {per_token} bytes per token give {page}-byte pages of {} tokens, not {len})",
                m.block_size
            ),
            NOT_JUDGED,
        ));
    }
    if let Some(strides) = m.block_strides.as_ref().filter(|s| **s != m.block_lens) {
        return Err(refused(
            EV,
            "remote_meta.block_strides",
            Value::from(strides.clone()),
            "blocks padded past their length (strides other than block_lens) are not modelled",
            NOT_JUDGED,
        ));
    }
    if let Some(i) = m
        .region_num_blocks
        .as_ref()
        .and_then(|b| b.iter().position(|&n| n != m.num_blocks))
    {
        return Err(refused(
            EV,
            format!("remote_meta.region_num_blocks[{i}]"),
            m.region_num_blocks.as_ref().map_or(0, |b| b[i]),
            format!(
                "regions with other block counts than num_blocks ({}) are not modelled",
                m.num_blocks
            ),
            NOT_JUDGED,
        ));
    }
    shared_regions(
        EV,
        "remote_meta.",
        &m.other,
        case.request.blocks.local_block_ids.len(),
    )?;
    for (field, why) in [
        (
            "ple_block_len",
            "a per-layer-embedding group is not modelled",
        ),
        (
            "packed_member_layouts",
            "packed region members are not modelled",
        ),
    ] {
        if let Some(v) = m.other.get(field).filter(|v| !is_default(v)) {
            return Err(refused(
                EV,
                format!("remote_meta.{field}"),
                v,
                why,
                NOT_JUDGED,
            ));
        }
    }
    unknown_extra(EV, "remote_meta.", &m.other, &KNOWN_REMOTE_EXTRAS)
}

fn request(case: &TraceCase) -> Result<(), TraceErrorKind> {
    const EV: &str = "request";
    let b = &case.request.blocks;
    one(EV, "dcp_size", b.dcp_size, DCP)?;
    if !case.local_geometry.has_mamba {
        if b.local_block_ids.len() > 1 {
            return Err(refused(
                "local_geometry",
                "geometry._has_mamba",
                false,
                format!(
                    "the request has {} KV-cache groups, and several groups without mamba \
                     state are not modelled",
                    b.local_block_ids.len()
                ),
                NOT_JUDGED,
            ));
        }
        return Ok(());
    }
    for (g, &n) in b.local_num_computed_blocks.iter().enumerate().skip(1) {
        if n != 0 {
            return Err(refused(
                EV,
                format!("local_num_computed_blocks[{g}]"),
                n,
                "a prefix hit of a mamba group is not modelled (mamba groups transfer their state)",
                RECORD_V2,
            ));
        }
    }
    for (field, groups) in [
        ("local_block_ids", &b.local_block_ids),
        ("remote_block_ids", &b.remote_block_ids),
    ] {
        if let Some(g) = groups.iter().skip(1).position(|ids| ids.len() != 1) {
            return Err(refused(
                EV,
                format!("{field}[{}]", g + 1),
                Value::from(groups[g + 1].clone()),
                "a mamba group of other than one block per request is not modelled",
                NOT_JUDGED,
            ));
        }
    }
    Ok(())
}
