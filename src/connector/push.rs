//! Push mode: P plans and posts WRITEs into D's registered memory (one per
//! target rank), and D completes the request from P's notifications and runs
//! its receive post-process (vLLM's push worker, with kvgeom's corrections).
//!
//! vLLM 0.33.0 leaves D with an empty remote block list and computes the
//! block-size ratio in opposite directions on P and D; kvgeom's push instead
//! carries the covered sub-block count in the completion notification and
//! handles both kernel directions. The 0.33.0 behaviour stays available
//! through `Policy::push` (vLLM 0.33.0's push protocol in `policy.rs`).

use serde::Serialize;

use super::block_mapping::{logical_to_kernel, BlockIds};
use super::planner::{plan_transfer, PlanError, PlannedTransfer, TransferBlocks};
use super::policy::{
    DecodePushHandshake, PushCompletionReport, PushRatioDirection, ReplicatedPageWriters,
};
use super::post_process::KvMemory;
use super::post_process::{self, GroupPostProcess, PostProcessInput};
use super::pull::PlannedRead;
use super::worker::{ConnectorError, RemoteEngine, Worker};
use crate::geometry::{block_size_ratio, GroupKind, Mode};
use crate::nixl::{Nixl, XferOp};

/// What P's worker knows about one request to push: its own blocks and D's
/// registration (D's logical ids).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct WriteRequest {
    /// P's request id.
    pub request_id: String,
    /// P's logical block ids per group.
    pub local_block_ids: BlockIds,
    /// The decode engine written to.
    pub remote_engine_id: String,
    /// D's request id (notifications carry it).
    pub remote_request_id: String,
    /// D's logical block ids per group (from D's registration).
    pub remote_block_ids: BlockIds,
    /// The decode engine's TP size.
    pub remote_tp_size: u32,
    /// D's prefix-cache hit: logical blocks per group D already computed.
    pub remote_num_computed_blocks: Vec<u32>,
}

/// One decode rank a prefill rank writes to, with the request's blocks it
/// serves there (groups it does not serve emptied).
struct WriteTarget {
    rank: u32,
    local_block_ids: BlockIds,
    remote_block_ids: BlockIds,
}

/// D's prefix hit per group, in entries of P's list (units of the smaller kernel).
fn push_prefix_skip(req: &WriteRequest, engine: &RemoteEngine, groups: usize) -> Vec<usize> {
    let decode_block_tokens =
        u64::from(engine.ppl) * u64::from(engine.block_size) * u64::from(engine.sub_ratio);
    (0..groups)
        .map(|g| {
            let n = u64::from(req.remote_num_computed_blocks.get(g).copied().unwrap_or(0));
            (n * decode_block_tokens / u64::from(engine.block_size)) as usize
        })
        .collect()
}

/// The WRITEs P posted for one request.
#[derive(Clone, Debug, Serialize)]
pub struct Sending {
    /// The request as P's worker knows it.
    pub request: WriteRequest,
    /// One write (or notification) per destination rank.
    pub writes: Vec<PlannedRead>,
}

/// Prefix of the notification P sends to D when it refuses to push.
const PUSH_REJECT_PREFIX: &str = "PUSH_REJECT:";

/// What decode knows about one pushed request while its prefill ranks
/// write: which of them have completed, and the sub-blocks each reported.
#[derive(Clone, Debug)]
pub struct PushProgress {
    request_id: String,
    /// Agent names of the prefill ranks that write to this decode rank.
    expected: Vec<String>,
    seen: Vec<String>,
    covered: Vec<(usize, u64)>,
}

/// A prefill rank refused to push, and told decode why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{sender} refused to push: {reason}")]
pub struct PushRefused {
    pub sender: String,
    pub reason: String,
}

impl PushProgress {
    /// Take one notification from `sender`; notifications of other requests
    /// are ignored.
    pub fn receive(&mut self, sender: &str, message: &[u8]) -> Result<(), PushRefused> {
        let text = String::from_utf8_lossy(message);
        if let Some(reason) = text.strip_prefix(PUSH_REJECT_PREFIX) {
            return Err(PushRefused {
                sender: sender.to_string(),
                reason: reason.to_string(),
            });
        }
        if let Some((req, counts)) = parse_completion(&text) {
            if req == self.request_id {
                self.seen.push(sender.to_string());
                self.covered.extend(counts);
            }
        }
        Ok(())
    }

    /// Whether every expected prefill rank has completed.
    pub fn complete(&self) -> bool {
        self.missing().is_none()
    }

    /// The first expected prefill rank (agent name) not heard from yet.
    pub fn missing(&self) -> Option<&str> {
        self.expected
            .iter()
            .find(|e| !self.seen.contains(e))
            .map(String::as_str)
    }

    /// The sub-blocks the prefill ranks reported written, per attention group
    /// (empty under vLLM 0.33.0's protocol, which reports none).
    pub fn covered(&self) -> &[(usize, u64)] {
        &self.covered
    }
}

/// Parse a completion notification: `"<req>:<n>"` (vLLM) or
/// `"<req>:<n>;covered=<g>:<count>,..."` (kvgeom).
fn parse_completion(message: &str) -> Option<(String, Vec<(usize, u64)>)> {
    let (head, covered) = match message.split_once(";covered=") {
        Some((h, c)) => (h, Some(c)),
        None => (message, None),
    };
    let (req, _) = head.rsplit_once(':')?;
    let mut counts = Vec::new();
    if let Some(c) = covered {
        for item in c.split(',').filter(|s| !s.is_empty()) {
            let (g, n) = item.split_once(':')?;
            counts.push((g.parse().ok()?, n.parse().ok()?));
        }
    }
    Some((req.to_string(), counts))
}

impl Worker {
    /// P side: plan and post the WRITEs of one request, one per decode rank
    /// this prefill rank serves.
    pub fn start_write(
        &mut self,
        nixl: &mut dyn Nixl,
        req: &WriteRequest,
    ) -> Result<Sending, ConnectorError> {
        let engine = self.remote_engine(&req.remote_engine_id)?.clone();
        let t = self.tp_ratio_to(req.remote_tp_size)?;
        let geometry = self.transfer_geometry(&engine, Mode::Push)?;
        let prefix_skip = push_prefix_skip(req, &engine, geometry.groups.len());
        let mut writes = Vec::new();
        for (position, target) in self.write_targets(&engine, req, t).iter().enumerate() {
            let remote = engine
                .ranks
                .get(&target.rank)
                .ok_or(PlanError::NoHandshake { rank: target.rank })?;
            let is_mla = self.cfg.model.is_mla();
            let local_handle = if t < 0 && (!is_mla || engine.mapping.all_source_ranks.len() > 1) {
                self.split_handles
                    .get(&self.split_key(t, engine.block_size))
                    .and_then(|v| v.get(position))
                    .map(|(h, _)| *h)
            } else {
                self.share_handle(t, engine.block_size)
                    .or_else(|| self.local_handle(1, engine.block_size, position, 1))
            }
            .ok_or(PlanError::NoLocalList)?;
            let blocks = TransferBlocks {
                initiator: &target.local_block_ids,
                peer: &target.remote_block_ids,
                prefix_skip: &prefix_skip,
                peer_sub_blocks: None,
            };
            let ids = match plan_transfer(&geometry, blocks, &self.cfg.policy)? {
                PlannedTransfer::NotifyOnly { .. } => {
                    // Nothing to write from this rank: only tell decode it is done.
                    let notification = format!(
                        "{}:{};covered=",
                        req.remote_request_id, self.cfg.engine.tp_size
                    );
                    nixl.send_notification(
                        self.agent,
                        &remote.agent_name,
                        notification.as_bytes(),
                    )?;
                    continue;
                }
                PlannedTransfer::Transfer(ids) => ids,
            };
            let notification = self.completion_notification(req, &ids.remote_block_ids);
            let xfer = nixl.make_xfer(
                self.agent,
                XferOp::Write,
                local_handle,
                &ids.local_desc_ids,
                remote.handle()?,
                &ids.remote_desc_ids,
                Some(notification.as_bytes()),
            )?;
            nixl.post_xfer(self.agent, xfer)?;
            writes.push(PlannedRead {
                remote_rank: target.rank,
                local_block_ids: ids.local_block_ids,
                remote_block_ids: ids.remote_block_ids,
                local_desc_ids: ids.local_desc_ids,
                remote_desc_ids: ids.remote_desc_ids,
                notification,
                xfer: Some(xfer),
            });
        }
        Ok(Sending {
            request: req.clone(),
            writes,
        })
    }

    /// The decode ranks this prefill rank writes to, each with the request's
    /// groups it serves there. Decode ranks that replicate their KV (MLA, or
    /// more decode ranks than KV heads) each need the attention pages; of
    /// several prefill ranks holding the same replica, the policy decides
    /// which write it.
    fn write_targets(&self, engine: &RemoteEngine, req: &WriteRequest, t: i32) -> Vec<WriteTarget> {
        let groups = &self.cfg.model.groups;
        let mapping = &engine.mapping;
        let total_heads = self
            .cfg
            .model
            .attention
            .as_ref()
            .map_or(1, |a| a.total_kv_heads());
        let replicate_attention =
            t < 0 && (self.cfg.model.is_mla() || req.remote_tp_size > total_heads);
        let ranks: Vec<u32> = if replicate_attention && !self.cfg.model.has_mamba() {
            engine.ranks.keys().copied().collect()
        } else {
            mapping.all_source_ranks.clone()
        };
        let skip_replicas = self.cfg.policy.push.replicated_pages
            == ReplicatedPageWriters::OnePerDecodeRank
            && self.holds_a_replica(t, total_heads);
        let keep = |ids: &BlockIds, rank: u32| -> BlockIds {
            ids.iter()
                .enumerate()
                .map(|(g, v)| {
                    let attention = groups[g] == GroupKind::Attention;
                    let served = (replicate_attention && attention)
                        || mapping.source_ranks_per_group[g].contains(&rank);
                    if served && !(attention && skip_replicas) {
                        v.clone()
                    } else {
                        Vec::new()
                    }
                })
                .collect()
        };
        ranks
            .into_iter()
            .map(|rank| WriteTarget {
                rank,
                local_block_ids: keep(&req.local_block_ids, rank),
                remote_block_ids: keep(&req.remote_block_ids, rank),
            })
            .collect()
    }

    /// The notification that completes one WRITE: the request, this engine's
    /// TP size, and (under kvgeom's protocol) the sub-blocks written per
    /// attention group.
    fn completion_notification(&self, req: &WriteRequest, remote_ids: &BlockIds) -> String {
        let groups = &self.cfg.model.groups;
        let mut notification = format!("{}:{}", req.remote_request_id, self.cfg.engine.tp_size);
        if self.cfg.policy.push.completion_report == PushCompletionReport::CoveredCounts {
            let covered: Vec<String> = remote_ids
                .iter()
                .enumerate()
                .filter(|(g, ids)| groups[*g] == GroupKind::Attention && !ids.is_empty())
                .map(|(g, ids)| format!("{g}:{}", ids.len()))
                .collect();
            notification.push_str(";covered=");
            notification.push_str(&covered.join(","));
        }
        notification
    }

    /// Whether this prefill rank's attention pages duplicate those of the
    /// previous prefill rank writing to the same decode rank (`t` > 1 prefill
    /// ranks per decode rank): MLA latents always, full attention when the
    /// two ranks hold the same KV head (more prefill ranks than heads).
    fn holds_a_replica(&self, t: i32, total_heads: u32) -> bool {
        let rank = self.cfg.tp_rank;
        if t <= 1 || rank % t as u32 == 0 {
            return false;
        }
        let tp = u64::from(self.cfg.engine.tp_size);
        let head_of = |r: u32| u64::from(r) * u64::from(total_heads) / tp;
        self.cfg.model.is_mla() || head_of(rank) == head_of(rank - 1)
    }

    /// D side: start tracking the completion of request `request_id`
    /// pushed by `prefill_engine_id`.
    pub fn expect_push(
        &self,
        prefill_engine_id: &str,
        request_id: &str,
    ) -> Result<PushProgress, ConnectorError> {
        let engine = self.remote_engine(prefill_engine_id)?;
        let expected = engine
            .mapping
            .all_source_ranks
            .iter()
            .map(|r| {
                engine
                    .ranks
                    .get(r)
                    .map(|rank| rank.agent_name.clone())
                    .ok_or(PlanError::NoHandshake { rank: *r })
            })
            .collect::<Result<_, _>>()?;
        Ok(PushProgress {
            request_id: request_id.to_string(),
            expected,
            seen: Vec::new(),
            covered: Vec::new(),
        })
    }

    /// P side: this rank refused to push to `decode_agent` with `error`.
    /// Under kvgeom's protocol it tells decode why and returns true; under
    /// vLLM 0.33.0's it only logs, so decode is never told (false).
    pub fn refuse_push(
        &self,
        nixl: &mut dyn Nixl,
        decode_agent: &str,
        error: &ConnectorError,
    ) -> Result<bool, ConnectorError> {
        if self.cfg.policy.push.decode_handshake == DecodePushHandshake::RecordOnly {
            return Ok(false);
        }
        let reason = format!("{PUSH_REJECT_PREFIX}{error}");
        nixl.send_notification(self.agent, decode_agent, reason.as_bytes())?;
        Ok(true)
    }

    /// D side: the post-process of a pushed request once every notification
    /// arrived. `covered` holds the sub-block counts P reported per attention
    /// group (empty under vLLM 0.33.0's push, which reports none).
    pub fn plan_push_post_process(
        &self,
        prefill_engine_id: &str,
        local_block_ids: &BlockIds,
        covered: &[(usize, u64)],
    ) -> Result<Vec<GroupPostProcess>, ConnectorError> {
        let groups = &self.cfg.model.groups;
        let engine = self.remote_engine(prefill_engine_id)?;
        let local_kernel = logical_to_kernel(local_block_ids, groups, self.reg.ppl);
        let one_way = self.cfg.policy.push.ratio_direction == PushRatioDirection::LocalOverRemote;
        let empty_ids = self.cfg.policy.push.completion_report == PushCompletionReport::RequestOnly;
        // The prefill engine's kernel as D registered it (before any gcd view).
        let prefill_kernel = engine
            .ranks
            .values()
            .next()
            .map_or(engine.block_size, |r| r.metadata.block_size);
        let ratio = match block_size_ratio(self.reg.kernel_block, prefill_kernel) {
            Some(r) => r,
            None if one_way || empty_ids => {
                return Err(ConnectorError::Completion(format!(
                    "AssertionError: Local block size {} is not divisible by remote block size {} or vice versa.",
                    self.reg.kernel_block, prefill_kernel
                )))
            }
            // kvgeom: P wrote whole decode pages; count them at ratio 1.
            None => 1,
        };
        let hetero_ppl = engine.ppl != self.reg.ppl;
        if empty_ids && (ratio > 1 || hetero_ppl) {
            return Err(ConnectorError::Completion(
                "IndexError: tuple index out of range (decode keeps an empty remote block list in push mode)".into(),
            ));
        }
        let remote_counts: Vec<usize> = (0..groups.len())
            .map(|g| {
                covered
                    .iter()
                    .filter(|(cg, _)| *cg == g)
                    .map(|(_, c)| *c as usize)
                    .max()
                    // Without a report, assume everything local was written.
                    .unwrap_or(local_kernel[g].len() * ratio as usize)
            })
            .collect();
        Ok(post_process::plan(&PostProcessInput {
            groups,
            is_mla: self.cfg.model.is_mla(),
            layout: self.cfg.engine.layout,
            ratio,
            hetero_ppl: hetero_ppl || ratio > 1 || !covered.is_empty(),
            local_kernel_ids: &local_kernel,
            remote_counts: &remote_counts,
            kernel_block: self.reg.kernel_block,
            num_kernel_blocks: self.reg.num_kernel_blocks,
            zeroing: self.cfg.policy.receive_zeroing,
            covered_ranges: None,
        }))
    }

    /// D side: apply the push post-process to this worker's memory once
    /// `progress` is complete.
    pub fn finish_push(
        &self,
        prefill_engine_id: &str,
        local_block_ids: &BlockIds,
        progress: &PushProgress,
        memory: &mut dyn KvMemory,
    ) -> Result<Vec<GroupPostProcess>, ConnectorError> {
        let plans =
            self.plan_push_post_process(prefill_engine_id, local_block_ids, progress.covered())?;
        post_process::apply(&plans, &self.page_geometries(), memory);
        Ok(plans)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completion_messages_parse_both_forms() {
        assert_eq!(parse_completion("req-7:2"), Some(("req-7".into(), vec![])));
        assert_eq!(
            parse_completion("req:x:1;covered=0:8,3:2"),
            Some(("req:x".into(), vec![(0, 8), (3, 2)]))
        );
        assert_eq!(parse_completion("nocolon"), None);
    }
}
