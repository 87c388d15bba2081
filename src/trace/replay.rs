//! Rebuilding a traced case with the project's own connector: the same
//! worker, the same remote handshakes and the same request, through the
//! recording dry-run transport, so its lists and transfers can be diffed
//! against what vLLM 0.33.0 did.

use std::collections::BTreeMap;

use super::case::TraceCase;
use super::diff::{diff_block_ids, diff_run, ActualRun, DiffReport, Difference};
use crate::connector::{
    ConnectorError, HandshakeMetadata, KvTensor, Policy, ReadRequest, Role, Worker, WorkerConfig,
};
use crate::geometry::{
    AttentionSpec, EngineGeometry, GroupKind, KvLayout, MambaKind, MambaSpec, ModelSpec,
};
use crate::nixl::{DryRun, Recording};

/// Why a trace cannot be replayed.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The trace describes a model kvgeom's geometry cannot express.
    #[error("{case}: the trace's model is not one kvgeom can rebuild: {why}")]
    Model {
        /// The trace case's name.
        case: String,
        /// What cannot be rebuilt.
        why: String,
    },
    /// kvgeom's connector refused the rebuilt case.
    #[error("{case}: the connector refused the case: {source}")]
    Connector {
        /// The trace case's name.
        case: String,
        /// The connector's refusal.
        #[source]
        source: ConnectorError,
    },
}

/// The outcome of a replay: the recording and where its memory was.
pub struct Replay {
    /// Every NIXL call the connector made, on the dry-run transport.
    pub recording: Recording<DryRun>,
    /// The run as the diff compares it with the trace.
    pub actual: ActualRun,
    /// P's block ids after kernel expansion (vLLM rewrites them in place);
    /// empty when the connector refused the read.
    pub remote_kernel_ids: Vec<Vec<u64>>,
    /// Why kvgeom's connector refused the read (its planning), if it did:
    /// the lists were prepared and no transfer was made.
    pub read_refused: Option<String>,
}

fn layout(name: &str) -> KvLayout {
    if name == "LBHNC" || name == "HND" {
        KvLayout::Hnd
    } else {
        KvLayout::Nhd
    }
}

/// The model of vLLM's geometry tests, from the numbers the trace carries:
/// MLA pages of `block_len / kernel` bytes per token, and KDA state whose
/// conv part splits Q|K|V = 1:1:2 over 3 rows of 2-byte values. vLLM's
/// `_mamba_ssm_size` is one decode rank's shard, so both state sizes are
/// scaled by decode's TP size to the model's.
pub fn traced_model(case: &TraceCase) -> Result<ModelSpec, ReplayError> {
    let g = &case.local_geometry;
    let bad = |why: &str| ReplayError::Model {
        case: case.name.clone(),
        why: why.to_string(),
    };
    if !g.use_mla {
        return Err(bad(
            "only MLA traces are supported; record a v2 trace of the geometry instead \
             (`kvgeom sweep --connector vllm GEOMETRY --record-traces DIR`, docs/trace-format.md \"Recording\")",
        ));
    }
    let per_token =
        g.block_len_per_layer.first().copied().unwrap_or(0) / u64::from(g.block_size.max(1));
    let groups = case.request.blocks.local_block_ids.len();
    let mut kinds = vec![GroupKind::Attention];
    let mamba = if g.has_mamba {
        let sizes = g.mamba_ssm_size.clone().unwrap_or_default();
        let (conv, ssm) = match sizes.as_slice() {
            [c, s] => (*c, *s),
            _ => return Err(bad("mamba sizes missing")),
        };
        // vLLM reports one rank's shard: the model's conv state is the
        // shard times decode's TP size, as is its SSM state.
        let tp = u64::from(g.world_size.max(1));
        let conv_total = conv.saturating_mul(tp);
        if conv_total % 24 != 0 || u32::try_from(conv_total / 24).is_err() {
            return Err(bad(
                "conv state does not split Q|K|V = 1:1:2 over 3 rows of 2 bytes",
            ));
        }
        let unit = (conv_total / 24) as u32;
        kinds.extend(std::iter::repeat_n(
            GroupKind::Mamba,
            groups.saturating_sub(1),
        ));
        Some(MambaSpec {
            kind: MambaKind::Kda,
            conv_dims: vec![unit, unit, 2 * unit],
            conv_rows: 3,
            conv_dtype_bytes: 2,
            ssm_state_bytes: ssm.saturating_mul(tp),
            n_groups: None,
        })
    } else {
        None
    };
    Ok(ModelSpec {
        attention: Some(AttentionSpec::Mla {
            head_size: per_token as u32,
            dtype_bytes: 1,
        }),
        state_slots: state_slots(case, mamba.is_some())?,
        mamba,
        groups: kinds,
        layer_slots: g.num_regions,
    })
}

/// The layer slots holding state, from vLLM's `_ssm_region_indices`: `None`
/// when every region does (or, in older traces, none is listed), else the
/// count of a leading run of regions; other sets cannot be stated.
fn state_slots(case: &TraceCase, has_mamba: bool) -> Result<Option<u32>, ReplayError> {
    let g = &case.local_geometry;
    let indices = &g.ssm_region_indices;
    if !has_mamba || indices.is_empty() || indices.len() as u32 == g.num_regions {
        return Ok(None);
    }
    if indices.iter().enumerate().any(|(i, &r)| r != i as u32) {
        return Err(ReplayError::Model {
            case: case.name.clone(),
            why: format!(
                "mamba state in regions {indices:?}: kvgeom's format states a leading run of \
                 layer slots (model.state_slots)"
            ),
        });
    }
    Ok(Some(indices.len() as u32))
}

/// Replay `case` through the project's connector under `policy`.
pub fn replay(case: &TraceCase, policy: Policy) -> Result<Replay, ReplayError> {
    let model = traced_model(case)?;
    let g = &case.local_geometry;
    let w = &case.worker;
    let engine = EngineGeometry {
        tp_size: w.tp_size,
        kernel_block: w.kernel_block_size,
        logical_block: w.local_block_size,
        num_logical_blocks: Some(w.num_logical_blocks),
        layout: layout(&g.kv_cache_layout),
        host_buffer: g.use_host_buffer,
        prefix_caching: false,
        block_padding_bytes: 0,
    };
    let own_mem = case.dlists.first().map_or(g.nixl_memory_type, |d| d.mem);
    let cfg = WorkerConfig {
        engine_id: g.engine_id.clone(),
        agent_name: "local".into(),
        model,
        engine,
        num_logical_blocks: w.num_logical_blocks,
        tp_rank: w.tp_rank,
        role: Role::PullReader,
        mem: own_mem,
        platform_mem: g.nixl_memory_type,
        device: 0,
        policy,
        // A recorded trace got past vLLM's own hash check.
        compat_factors: None,
        enforce_compat: false,
    };
    let tensors: Vec<KvTensor> = case
        .local_regions
        .iter()
        .map(|r| KvTensor {
            base: r.addr,
            len: r.len,
        })
        .collect();
    let connector = |source| ReplayError::Connector {
        case: case.name.clone(),
        source,
    };
    let mut nixl = Recording::new(DryRun::new());
    let mut worker = Worker::register(&mut nixl, cfg, &tensors).map_err(connector)?;
    let mut remote_bases = BTreeMap::new();
    for remote in &case.remotes {
        let m = &remote.meta;
        let ssm = m.ssm_sizes.clone().unwrap_or_default();
        let meta = HandshakeMetadata {
            engine_id: m.engine_id.clone(),
            agent_metadata: remote.agent_name.clone().into_bytes(),
            device_id: m.device_id,
            kv_caches_base_addr: m.kv_caches_base_addr.clone(),
            num_blocks: m.num_blocks,
            block_lens: m.block_lens.clone(),
            block_strides: m
                .block_strides
                .clone()
                .unwrap_or_else(|| m.block_lens.clone()),
            kv_cache_layout: layout(&m.kv_cache_layout),
            block_size: m.block_size,
            ssm_sizes: (
                ssm.first().copied().unwrap_or(0),
                ssm.get(1).copied().unwrap_or(0),
            ),
            physical_blocks_per_logical_kv_block: m.physical_blocks_per_logical_kv_block,
            host_buffer: false,
            region_mem_types: m.region_mem_types.clone(),
            compat_factors: None,
        };
        worker
            .add_remote_agent(&mut nixl, &meta, remote.tp_rank, remote.tp_size)
            .map_err(connector)?;
        remote_bases.insert(remote.agent_name.clone(), m.kv_caches_base_addr.clone());
    }
    let blocks = &case.request.blocks;
    let remote_request_id = case
        .xfers
        .iter()
        .find_map(|x| {
            x.notif_msg
                .as_deref()
                .and_then(|n| n.rsplit_once(':'))
                .map(|(r, _)| r.to_string())
        })
        .unwrap_or_else(|| format!("prefill-{}", case.request.req_id));
    let request = ReadRequest {
        request_id: case.request.req_id.clone(),
        local_block_ids: block_ids_u32(&blocks.local_block_ids),
        remote_engine_id: blocks.remote_engine_id.clone(),
        remote_request_id,
        remote_block_ids: block_ids_u32(&blocks.remote_block_ids),
        remote_tp_size: blocks.tp_size,
        local_num_computed_blocks: blocks
            .local_num_computed_blocks
            .iter()
            .map(|&n| u32::try_from(n).unwrap_or(u32::MAX))
            .collect(),
        // Traces do not record the transfer parameters' token count: a
        // policy that pairs from the last token declines such a read.
        remote_num_tokens: None,
    };
    let (remote_kernel_ids, read_refused) = match worker.start_read(&mut nixl, &request) {
        Ok(receiving) => (
            receiving
                .remote_kernel_ids
                .iter()
                .map(|g| g.iter().map(|&b| u64::from(b)).collect())
                .collect(),
            None,
        ),
        Err(e) => (Vec::new(), Some(e.to_string())),
    };
    Ok(Replay {
        actual: ActualRun {
            agent: worker.agent(),
            local_bases: tensors.iter().map(|t| t.base).collect(),
            remote_bases,
        },
        remote_kernel_ids,
        read_refused,
        recording: nixl,
    })
}

/// Replay `case` and compare every prepared list, every transfer and the
/// rewritten remote ids with vLLM's.
pub fn diff_against_connector(case: &TraceCase, policy: Policy) -> Result<DiffReport, ReplayError> {
    let run = replay(case, policy)?;
    let report = diff_run(case, run.recording.events(), &run.actual);
    if !report.is_match() {
        return Ok(report);
    }
    // vLLM raised in the read (its planning refused the request) exactly
    // when kvgeom's connector refused it: then the lists and the transfers
    // made (none, or those before the refusal) are all there is to compare.
    let vllm_raised = case
        .request_done
        .as_ref()
        .and_then(|d| d.exception.as_ref())
        .filter(|e| !e.is_null())
        .map(|e| match e {
            serde_json::Value::String(text) => text.clone(),
            other => other.to_string(),
        });
    match (vllm_raised, run.read_refused) {
        (None, None) => {}
        (Some(_), Some(_)) => return Ok(report),
        (vllm, kvgeom) => {
            return Ok(DiffReport::Differ(Difference::ReadOutcome { vllm, kvgeom }));
        }
    }
    match case
        .request_done
        .as_ref()
        .and_then(|d| d.after_call.as_ref())
    {
        Some(after) => Ok(diff_block_ids(
            "request_done remote_block_ids",
            &after.remote_block_ids,
            &run.remote_kernel_ids,
        )),
        None => Ok(report),
    }
}

/// A trace's block ids per group as the connector takes them (an id past
/// `u32` saturates: no pool holds it, so the connector refuses it).
pub(crate) fn block_ids_u32(ids: &[Vec<u64>]) -> Vec<Vec<u32>> {
    ids.iter()
        .map(|g| {
            g.iter()
                .map(|&b| u32::try_from(b).unwrap_or(u32::MAX))
                .collect()
        })
        .collect()
}
