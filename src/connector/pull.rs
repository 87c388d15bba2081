//! Pull mode on D: plan and post the READs of one request (one per source
//! rank), then, once they are done, run the receive post-process
//! (vLLM's `_read_blocks_for_req`, `_read_blocks` and `get_finished`).

use serde::Serialize;

use super::block_mapping::{
    align_from_first_token, apply_prefix_caching, logical_to_kernel, map_for_block_size_ratio,
    BlockIds,
};
use super::post_process::KvMemory;
use super::post_process::{self, GroupPostProcess, PostProcessInput};
use super::worker::{ConnectorError, Worker};
use crate::defects::Defect;
use crate::geometry::{block_size_ratio, tp_ratio};
use crate::nixl::{Nixl, XferHandle, XferOp, XferState};

/// What D's scheduler hands the worker for one request to receive.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ReadRequest {
    pub request_id: String,
    /// D's logical block ids per group (only the blocks the transfer fills).
    pub local_block_ids: BlockIds,
    pub remote_engine_id: String,
    pub remote_request_id: String,
    /// P's logical block ids per group.
    pub remote_block_ids: BlockIds,
    pub remote_tp_size: u32,
    /// D's prefix-cache hit: logical blocks per group already computed
    /// locally (they precede `local_block_ids` in the request).
    pub local_num_computed_blocks: Vec<u32>,
}

/// One planned READ (or notification) towards one source rank.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PlannedRead {
    pub remote_rank: u32,
    pub local_block_ids: BlockIds,
    pub remote_block_ids: BlockIds,
    pub local_desc_ids: Vec<u32>,
    pub remote_desc_ids: Vec<u32>,
    pub notification: String,
    /// `None` when only a notification was sent (full prefix hit).
    pub xfer: Option<XferHandle>,
}

/// A request being received.
#[derive(Clone, Debug, Serialize)]
pub struct Receiving {
    pub request: ReadRequest,
    /// D's kernel-expanded ids.
    pub local_kernel_ids: BlockIds,
    /// P's kernel-expanded ids, untrimmed (sizes the zeroing).
    pub remote_kernel_ids: BlockIds,
    /// Remote-granularity entries skipped per group for D's prefix hit.
    pub prefix_skip: Vec<usize>,
    pub reads: Vec<PlannedRead>,
}

/// A request whose transfers are all done, with its post-process.
#[derive(Clone, Debug, Serialize)]
pub struct Received {
    pub request_id: String,
    pub post_process: Vec<GroupPostProcess>,
}

impl Worker {
    /// Plan and post the READs of `req` (vLLM's `start_load_kv` for one request).
    pub fn start_read(
        &mut self,
        nixl: &mut dyn Nixl,
        req: &ReadRequest,
    ) -> Result<Receiving, ConnectorError> {
        let groups = self.cfg.model.groups.clone();
        let engine = self.remote_engine(&req.remote_engine_id)?.clone();
        let local_kernel = logical_to_kernel(&req.local_block_ids, &groups, self.reg.ppl);
        let remote_ppl = if self.cfg.defect == Some(Defect::RemoteIdsLocalPpl) {
            self.reg.ppl
        } else {
            engine.ppl
        };
        let remote_kernel = logical_to_kernel(&req.remote_block_ids, &groups, remote_ppl);
        let t = tp_ratio(self.cfg.engine.tp_size, req.remote_tp_size)
            .ok_or_else(|| ConnectorError::Plan("TP sizes do not divide".into()))?;
        let ratio = block_size_ratio(self.reg.kernel_block, engine.block_size)
            .ok_or_else(|| ConnectorError::Plan("kernel block sizes do not divide".into()))?;
        let mapping = &engine.mapping;
        let specs: Vec<(u32, BlockIds, BlockIds)> = mapping
            .all_source_ranks
            .iter()
            .map(|&rank| {
                let keep = |ids: &BlockIds| -> BlockIds {
                    ids.iter()
                        .enumerate()
                        .map(|(g, v)| {
                            if mapping.source_ranks_per_group[g].contains(&rank) {
                                v.clone()
                            } else {
                                Vec::new()
                            }
                        })
                        .collect()
                };
                (rank, keep(&local_kernel), keep(&remote_kernel))
            })
            .collect();
        let notification = format!("{}:{}", req.remote_request_id, mapping.local_consumers);
        // D's prefix hit, in entries of P's kernel list.
        let hit_tokens = |n: u32| u64::from(n) * u64::from(self.cfg.engine.logical_block);
        let prefix_skip: Vec<usize> = (0..groups.len())
            .map(|g| {
                let n = req.local_num_computed_blocks.get(g).copied().unwrap_or(0);
                (hit_tokens(n) / u64::from(engine.block_size)) as usize
            })
            .collect();
        let mut reads = Vec::new();
        for (position, (rank, local_ids, remote_ids)) in specs.iter().enumerate() {
            let remote = engine.ranks.get(rank).ok_or_else(|| {
                ConnectorError::Plan(format!("no handshake with remote rank {rank}"))
            })?;
            let local_handle = self
                .local_handle(t, engine.block_size, position, specs.len())
                .ok_or_else(|| {
                    ConnectorError::Plan("no local list for this remote geometry".into())
                })?;
            let (mut local_ids, mut remote_ids) = (local_ids.clone(), remote_ids.clone());
            if ratio > 1 {
                (local_ids, remote_ids) =
                    map_for_block_size_ratio(&local_ids, &remote_ids, &groups, ratio);
            }
            if local_ids.iter().all(Vec::is_empty) {
                nixl.send_notification(self.agent, &remote.agent_name, notification.as_bytes())?;
                reads.push(PlannedRead {
                    remote_rank: *rank,
                    local_block_ids: local_ids,
                    remote_block_ids: remote_ids,
                    local_desc_ids: Vec::new(),
                    remote_desc_ids: Vec::new(),
                    notification: notification.clone(),
                    xfer: None,
                });
                continue;
            }
            let aligned = if self.cfg.defect == Some(Defect::EndTrimAlignment) {
                apply_prefix_caching(
                    &local_ids,
                    &remote_ids,
                    &groups,
                    self.reg.ppl,
                    engine.ppl,
                    self.cfg.defect,
                )
            } else {
                // Decode's list counts prefill's (smaller) kernel blocks here,
                // so decode's ppl does too.
                align_from_first_token(
                    &local_ids,
                    &remote_ids,
                    &groups,
                    &prefix_skip,
                    self.reg.ppl * ratio,
                    engine.ppl,
                    self.cfg.defect,
                )
            };
            let (local_ids, remote_ids) =
                aligned.map_err(|e| ConnectorError::Plan(e.to_string()))?;
            let (local_desc_ids, remote_desc_ids) =
                self.desc_id_pair(&local_ids, &remote_ids, &engine, ratio)?;
            let xfer = nixl.make_xfer(
                self.agent,
                XferOp::Read,
                local_handle,
                &local_desc_ids,
                remote.handle,
                &remote_desc_ids,
                Some(notification.as_bytes()),
            )?;
            nixl.post_xfer(self.agent, xfer)?;
            reads.push(PlannedRead {
                remote_rank: *rank,
                local_block_ids: local_ids,
                remote_block_ids: remote_ids,
                local_desc_ids,
                remote_desc_ids,
                notification: notification.clone(),
                xfer: Some(xfer),
            });
        }
        if self.cfg.model.is_mla() && t < 0 && specs.len() == 1 {
            // Replicas on the other remote ranks are released by a notification.
            let read_rank = specs[0].0;
            for (rank, remote) in &engine.ranks {
                if *rank != read_rank {
                    nixl.send_notification(
                        self.agent,
                        &remote.agent_name,
                        notification.as_bytes(),
                    )?;
                }
            }
        }
        Ok(Receiving {
            request: req.clone(),
            local_kernel_ids: local_kernel,
            remote_kernel_ids: remote_kernel,
            prefix_skip,
            reads,
        })
    }

    /// Whether every READ of `recv` is done.
    pub fn reads_done(
        &self,
        nixl: &mut dyn Nixl,
        recv: &Receiving,
    ) -> Result<bool, ConnectorError> {
        for read in &recv.reads {
            if let Some(x) = read.xfer {
                if nixl.xfer_state(self.agent, x)? != XferState::Done {
                    return Ok(false);
                }
            }
        }
        Ok(true)
    }

    /// The receive post-process of a finished request, planned.
    pub fn plan_receive_post_process(
        &self,
        recv: &Receiving,
    ) -> Result<Vec<GroupPostProcess>, ConnectorError> {
        let engine = self.remote_engine(&recv.request.remote_engine_id)?;
        let ratio = block_size_ratio(self.reg.kernel_block, engine.block_size)
            .ok_or_else(|| ConnectorError::Plan("Only nP < nD supported currently.".into()))?;
        // What the transfer could write: P's list past D's prefix hit
        // (vLLM 0.33.0 counts P's whole list).
        let skip_hit = self.cfg.defect != Some(Defect::EndTrimAlignment);
        let remote_counts: Vec<usize> = recv
            .remote_kernel_ids
            .iter()
            .enumerate()
            .map(|(g, ids)| {
                let skip = if skip_hit {
                    recv.prefix_skip.get(g).copied().unwrap_or(0)
                } else {
                    0
                };
                ids.len().saturating_sub(skip)
            })
            .collect();
        Ok(post_process::plan(&PostProcessInput {
            groups: &self.cfg.model.groups,
            is_mla: self.cfg.model.is_mla(),
            layout: self.cfg.engine.layout,
            ratio,
            hetero_ppl: engine.ppl != self.reg.ppl,
            local_kernel_ids: &recv.local_kernel_ids,
            remote_counts: &remote_counts,
            kernel_block: self.reg.kernel_block,
            defect: self.cfg.defect,
        }))
    }

    /// Release the transfers of a finished request and post-process its blocks.
    pub fn finish_read(
        &mut self,
        nixl: &mut dyn Nixl,
        recv: &Receiving,
        memory: &mut dyn KvMemory,
    ) -> Result<Received, ConnectorError> {
        let plans = self.plan_receive_post_process(recv)?;
        for read in &recv.reads {
            if let Some(x) = read.xfer {
                nixl.release_xfer(self.agent, x)?;
            }
        }
        post_process::apply(&plans, &self.page_geometries(), memory);
        Ok(Received {
            request_id: recv.request.request_id.clone(),
            post_process: plans,
        })
    }
}
