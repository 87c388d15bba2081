//! Pull mode on D: plan and post the READs of one request (one per source
//! rank), then, once they are done, run the receive post-process
//! (vLLM's `_read_blocks_for_req`, `_read_blocks` and `get_finished`).

use serde::Serialize;

use super::block_mapping::{logical_to_kernel, pair_from_last_token, BlockIds};
use super::planner::{peer_kernel_ids, plan_transfer, PlanError, PlannedTransfer, TransferBlocks};
use super::policy::PrefixAlignment;
use super::post_process::KvMemory;
use super::post_process::{self, GroupPostProcess, PostProcessInput};
use super::worker::{ConnectorError, RemoteEngine, Worker};
use crate::geometry::{block_size_ratio, Mode};
use crate::nixl::{DlistHandle, Nixl, XferHandle, XferOp, XferState};

/// What D's scheduler hands the worker for one request to receive.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ReadRequest {
    /// D's request id.
    pub request_id: String,
    /// D's logical block ids per group (only the blocks the transfer fills).
    pub local_block_ids: BlockIds,
    /// The prefill engine holding the KV.
    pub remote_engine_id: String,
    /// P's id for the same request (notifications carry it).
    pub remote_request_id: String,
    /// P's logical block ids per group.
    pub remote_block_ids: BlockIds,
    /// The prefill engine's TP size.
    pub remote_tp_size: u32,
    /// D's prefix-cache hit: logical blocks per group already computed
    /// locally (they precede `local_block_ids` in the request).
    pub local_num_computed_blocks: Vec<u32>,
    /// The tokens prefill computed (`remote_num_tokens` of the transfer
    /// parameters), when the request carries them: pairing from the last
    /// token needs it and declines the read without it.
    pub remote_num_tokens: Option<u32>,
}

/// One planned READ (or notification) towards one source rank.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PlannedRead {
    /// The prefill rank read from.
    pub remote_rank: u32,
    /// D's logical block ids per group this read fills.
    pub local_block_ids: BlockIds,
    /// P's logical block ids per group it reads.
    pub remote_block_ids: BlockIds,
    /// Rows of D's prepared local list, one per pair.
    pub local_desc_ids: Vec<u32>,
    /// Rows of P's prepared remote list, paired index by index with `local_desc_ids`.
    pub remote_desc_ids: Vec<u32>,
    /// The completion notification P receives.
    pub notification: String,
    /// `None` when only a notification was sent (full prefix hit).
    pub xfer: Option<XferHandle>,
}

/// One source rank of a read and the request's blocks it serves (groups
/// it does not hold emptied).
struct ReadSource {
    rank: u32,
    local_block_ids: BlockIds,
    remote_block_ids: BlockIds,
}

/// The source ranks of `req` with the groups each one serves.
fn read_sources(engine: &RemoteEngine, req: &ReadRequest) -> Vec<ReadSource> {
    let mapping = &engine.mapping;
    mapping
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
            ReadSource {
                rank,
                local_block_ids: keep(&req.local_block_ids),
                remote_block_ids: keep(&req.remote_block_ids),
            }
        })
        .collect()
}

/// A request being received.
#[derive(Clone, Debug, Serialize)]
pub struct Receiving {
    /// The request as the scheduler handed it.
    pub request: ReadRequest,
    /// D's kernel-expanded ids.
    pub local_kernel_ids: BlockIds,
    /// P's kernel-expanded ids, untrimmed (sizes the zeroing).
    pub remote_kernel_ids: BlockIds,
    /// Remote-granularity entries skipped per group for D's prefix hit.
    pub prefix_skip: Vec<usize>,
    /// Per group, the range of D's remote-sized sub-blocks the transfer
    /// covers, when the lists were paired from the last token.
    pub covered_sub_blocks: Option<Vec<std::ops::Range<u64>>>,
    /// One read (or notification) per source rank.
    pub reads: Vec<PlannedRead>,
}

/// A request whose transfers are all done, with its post-process.
#[derive(Clone, Debug, Serialize)]
pub struct Received {
    /// D's request id.
    pub request_id: String,
    /// The post-process of each attention group.
    pub post_process: Vec<GroupPostProcess>,
}

impl Worker {
    /// Plan and post the READs of `req` (vLLM's `start_load_kv` for one
    /// request): one planned transfer per source rank, then the
    /// notifications that release replicas nobody reads.
    pub fn start_read(
        &mut self,
        nixl: &mut dyn Nixl,
        req: &ReadRequest,
    ) -> Result<Receiving, ConnectorError> {
        let engine = self.remote_engine(&req.remote_engine_id)?.clone();
        let t = self.tp_ratio_to(req.remote_tp_size)?;
        let geometry = self.transfer_geometry(&engine, Mode::Pull)?;
        let prefix_skip = self.pull_prefix_skip(req, &engine);
        let notification = format!(
            "{}:{}",
            req.remote_request_id, engine.mapping.local_consumers
        );
        let sources = read_sources(&engine, req);
        let peer_sub_blocks = req
            .remote_num_tokens
            .map(|n| u64::from(n).div_ceil(u64::from(engine.block_size)));
        let mut reads = Vec::new();
        for (position, source) in sources.iter().enumerate() {
            let blocks = TransferBlocks {
                initiator: &source.local_block_ids,
                peer: &source.remote_block_ids,
                prefix_skip: &prefix_skip,
                peer_sub_blocks,
            };
            let planned = plan_transfer(&geometry, blocks, &self.cfg.policy)?;
            let local_handle = self
                .local_handle(t, engine.block_size, position, sources.len())
                .ok_or(PlanError::NoLocalList)?;
            reads.push(self.post_read(
                nixl,
                &engine,
                source.rank,
                local_handle,
                planned,
                &notification,
            )?);
        }
        if self.cfg.model.is_mla() && t < 0 && sources.len() == 1 {
            self.release_unread_replicas(nixl, &engine, sources[0].rank, &notification)?;
        }
        let local_kernel = logical_to_kernel(&req.local_block_ids, &geometry.groups, self.reg.ppl);
        let remote_kernel = peer_kernel_ids(&geometry, &req.remote_block_ids, &self.cfg.policy);
        let sizes_differ = geometry.ratio > 1 || geometry.initiator.ppl != geometry.peer.ppl;
        let covered_sub_blocks = match peer_sub_blocks {
            Some(sub_blocks)
                if sizes_differ
                    && self.cfg.policy.prefix_alignment
                        == PrefixAlignment::LastTokenWhenSizesDiffer =>
            {
                Some(
                    pair_from_last_token(
                        &local_kernel,
                        &remote_kernel,
                        &geometry.groups,
                        geometry.ratio,
                        geometry.initiator.ppl,
                        geometry.peer.ppl,
                        sub_blocks,
                    )
                    .covered,
                )
            }
            _ => None,
        };
        Ok(Receiving {
            request: req.clone(),
            local_kernel_ids: local_kernel,
            remote_kernel_ids: remote_kernel,
            prefix_skip,
            covered_sub_blocks,
            reads,
        })
    }

    /// D's prefix hit per group, in entries of P's kernel list.
    fn pull_prefix_skip(&self, req: &ReadRequest, engine: &RemoteEngine) -> Vec<usize> {
        let logical = u64::from(self.cfg.engine.logical_block);
        (0..self.cfg.model.groups.len())
            .map(|g| {
                let n = req.local_num_computed_blocks.get(g).copied().unwrap_or(0);
                (u64::from(n) * logical / u64::from(engine.block_size)) as usize
            })
            .collect()
    }

    /// Post one planned READ towards `rank` (or only notify it).
    fn post_read(
        &self,
        nixl: &mut dyn Nixl,
        engine: &RemoteEngine,
        rank: u32,
        local_handle: DlistHandle,
        planned: PlannedTransfer,
        notification: &str,
    ) -> Result<PlannedRead, ConnectorError> {
        let remote = engine
            .ranks
            .get(&rank)
            .ok_or(PlanError::NoHandshake { rank })?;
        match planned {
            PlannedTransfer::NotifyOnly {
                local_block_ids,
                remote_block_ids,
            } => {
                nixl.send_notification(self.agent, &remote.agent_name, notification.as_bytes())?;
                Ok(PlannedRead {
                    remote_rank: rank,
                    local_block_ids,
                    remote_block_ids,
                    local_desc_ids: Vec::new(),
                    remote_desc_ids: Vec::new(),
                    notification: notification.to_string(),
                    xfer: None,
                })
            }
            PlannedTransfer::Transfer(ids) => {
                let xfer = nixl.make_xfer(
                    self.agent,
                    XferOp::Read,
                    local_handle,
                    &ids.local_desc_ids,
                    remote.handle()?,
                    &ids.remote_desc_ids,
                    Some(notification.as_bytes()),
                )?;
                nixl.post_xfer(self.agent, xfer)?;
                Ok(PlannedRead {
                    remote_rank: rank,
                    local_block_ids: ids.local_block_ids,
                    remote_block_ids: ids.remote_block_ids,
                    local_desc_ids: ids.local_desc_ids,
                    remote_desc_ids: ids.remote_desc_ids,
                    notification: notification.to_string(),
                    xfer: Some(xfer),
                })
            }
        }
    }

    /// MLA read from one prefill rank: the replicas on the others are
    /// released by a notification.
    fn release_unread_replicas(
        &self,
        nixl: &mut dyn Nixl,
        engine: &RemoteEngine,
        read_rank: u32,
        notification: &str,
    ) -> Result<(), ConnectorError> {
        for (rank, remote) in &engine.ranks {
            if *rank != read_rank {
                nixl.send_notification(self.agent, &remote.agent_name, notification.as_bytes())?;
            }
        }
        Ok(())
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
            .ok_or(PlanError::RemoteKernelLarger)?;
        // What the transfer could write: P's list past D's prefix hit
        // (vLLM 0.33.0 counts P's whole list; pairing from the last token
        // records the covered range instead).
        let skip_hit = self.cfg.policy.prefix_alignment == PrefixAlignment::FromFirstToken;
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
            num_kernel_blocks: self.reg.num_kernel_blocks,
            zeroing: self.cfg.policy.receive_zeroing,
            covered_ranges: recv.covered_sub_blocks.as_deref(),
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
