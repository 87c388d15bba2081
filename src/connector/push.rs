//! Push mode: P plans and posts WRITEs into D's registered memory (one per
//! target rank), and D completes the request from P's notifications and runs
//! its receive post-process (vLLM's push worker, with kvgeom's corrections).
//!
//! vLLM 0.33.0 leaves D with an empty remote block list and computes the
//! block-size ratio in opposite directions on P and D; kvgeom's push instead
//! carries the covered sub-block count in the completion notification and
//! handles both kernel directions. The 0.33.0 behaviour stays available as
//! the `push-empty-remote-ids` and `push-one-way-ratio` defects.

use serde::Serialize;

use super::block_mapping::{
    align_from_first_token, apply_prefix_caching, logical_to_kernel, map_for_block_size_ratio,
    BlockIds,
};
use super::post_process::KvMemory;
use super::post_process::{self, GroupPostProcess, PostProcessInput};
use super::pull::PlannedRead;
use super::worker::{ConnectorError, Worker};
use crate::defects::Defect;
use crate::geometry::{block_size_ratio, tp_ratio, GroupKind};
use crate::nixl::{Nixl, XferOp};

/// What P's worker knows about one request to push: its own blocks and D's
/// registration (D's logical ids).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct WriteRequest {
    pub request_id: String,
    /// P's logical block ids per group.
    pub local_block_ids: BlockIds,
    pub remote_engine_id: String,
    /// D's request id (notifications carry it).
    pub remote_request_id: String,
    /// D's logical block ids per group (from D's registration).
    pub remote_block_ids: BlockIds,
    pub remote_tp_size: u32,
    /// D's prefix-cache hit: logical blocks per group D already computed.
    pub remote_num_computed_blocks: Vec<u32>,
}

/// The WRITEs P posted for one request.
#[derive(Clone, Debug, Serialize)]
pub struct Sending {
    pub request: WriteRequest,
    pub writes: Vec<PlannedRead>,
}

/// Prefix of the notification P sends to D when it refuses to push.
pub const PUSH_REJECT_PREFIX: &str = "PUSH_REJECT:";

/// Parse a completion notification: `"<req>:<n>"` (vLLM) or
/// `"<req>:<n>;covered=<g>:<count>,..."` (kvgeom).
pub fn parse_completion(message: &str) -> Option<(String, Vec<(usize, u64)>)> {
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
    /// P side: plan and post the WRITEs of one request.
    pub fn start_write(
        &mut self,
        nixl: &mut dyn Nixl,
        req: &WriteRequest,
    ) -> Result<Sending, ConnectorError> {
        let groups = self.cfg.model.groups.clone();
        let engine = self.remote_engine(&req.remote_engine_id)?.clone();
        let local_kernel = logical_to_kernel(&req.local_block_ids, &groups, self.reg.ppl);
        let mut remote_kernel = logical_to_kernel(&req.remote_block_ids, &groups, engine.ppl);
        if engine.sub_ratio > 1 {
            // Decode kernel blocks as prefill-sized sub-pages.
            let sub = engine.sub_ratio;
            for (g, kind) in groups.iter().enumerate() {
                if *kind == GroupKind::Attention {
                    remote_kernel[g] = remote_kernel[g]
                        .iter()
                        .flat_map(|&k| (0..sub).map(move |q| k * sub + q))
                        .collect();
                }
            }
        }
        let t = tp_ratio(self.cfg.engine.tp_size, req.remote_tp_size)
            .ok_or_else(|| ConnectorError::Plan("TP sizes do not divide".into()))?;
        let ratio =
            block_size_ratio(self.reg.kernel_block, engine.block_size).ok_or_else(|| {
                ConnectorError::Plan(format!(
                    "Local block size {} is not divisible by remote block size {} or vice versa.",
                    self.reg.kernel_block, engine.block_size
                ))
            })?;
        let is_mla = self.cfg.model.is_mla();
        let has_mamba = self.cfg.model.has_mamba();
        let mapping = &engine.mapping;
        let total_heads = self
            .cfg
            .model
            .attention
            .as_ref()
            .map_or(1, |a| a.total_kv_heads());
        // Decode ranks that replicate their KV (MLA, or more decode ranks
        // than KV heads) each need the attention pages: write them to every
        // decode rank served, not only to one rank per head.
        let replicate_attention = t < 0 && (is_mla || req.remote_tp_size > total_heads);
        let ranks: Vec<u32> = if replicate_attention && !has_mamba {
            engine.ranks.keys().copied().collect()
        } else {
            mapping.all_source_ranks.clone()
        };
        let keep = |ids: &BlockIds, rank: u32| -> BlockIds {
            ids.iter()
                .enumerate()
                .map(|(g, v)| {
                    let attention = groups[g] == GroupKind::Attention;
                    if (replicate_attention && attention)
                        || mapping.source_ranks_per_group[g].contains(&rank)
                    {
                        v.clone()
                    } else {
                        Vec::new()
                    }
                })
                .collect()
        };
        // D's prefix hit, in entries of P's (possibly split) list.
        let decode_block_tokens =
            u64::from(engine.ppl) * u64::from(engine.block_size) * u64::from(engine.sub_ratio);
        let prefix_skip: Vec<usize> = (0..groups.len())
            .map(|g| {
                let n = u64::from(req.remote_num_computed_blocks.get(g).copied().unwrap_or(0));
                (n * decode_block_tokens / u64::from(engine.block_size)) as usize
            })
            .collect();
        let mut writes = Vec::new();
        for (position, &rank) in ranks.iter().enumerate() {
            let remote = engine.ranks.get(&rank).ok_or_else(|| {
                ConnectorError::Plan(format!("no handshake with decode rank {rank}"))
            })?;
            let local_handle = if t < 0 && (!is_mla || mapping.all_source_ranks.len() > 1) {
                self.split_handles
                    .get(&self.split_key(t, engine.block_size))
                    .and_then(|v| v.get(position))
                    .map(|(h, _)| *h)
            } else {
                self.local_handle(1, engine.block_size, position, 1)
            }
            .ok_or_else(|| ConnectorError::Plan("no local list for this decode geometry".into()))?;
            let (mut local_ids, mut remote_ids) =
                (keep(&local_kernel, rank), keep(&remote_kernel, rank));
            let write_replicas_once = self.cfg.defect != Some(Defect::PushReplicatedDoubleWrite);
            if write_replicas_once && self.holds_a_replica(t, total_heads) {
                // Replicated pages: one prefill rank per decode rank writes them.
                for (g, kind) in groups.iter().enumerate() {
                    if *kind == GroupKind::Attention {
                        local_ids[g].clear();
                        remote_ids[g].clear();
                    }
                }
            }
            let vllm_alignment = self.cfg.defect == Some(Defect::EndTrimAlignment);
            if ratio > 1 && vllm_alignment {
                (local_ids, remote_ids) =
                    map_for_block_size_ratio(&local_ids, &remote_ids, &groups, ratio);
            } else if ratio > 1 {
                // Prefill pages larger than decode's become `ratio` decode-sized
                // sub-pages. Not clipped to decode's length here: after a prefix
                // hit decode's list starts later, and the alignment below drops
                // prefill's cached entries from the front first.
                for (ids, kind) in local_ids.iter_mut().zip(&groups) {
                    if *kind == GroupKind::Attention {
                        *ids = ids
                            .iter()
                            .flat_map(|&k| (0..ratio).map(move |q| k * ratio + q))
                            .collect();
                    }
                }
            }
            if engine.sub_ratio > 1 {
                // Decode sub-pages past what prefill holds are not written (zeroed on D).
                for (g, kind) in groups.iter().enumerate() {
                    if *kind == GroupKind::Attention {
                        let n = local_ids[g].len();
                        remote_ids[g].truncate(n);
                    }
                }
            }
            if local_ids.iter().all(Vec::is_empty) {
                // Nothing to write from this rank: only tell decode it is done.
                let notification = format!(
                    "{}:{};covered=",
                    req.remote_request_id, self.cfg.engine.tp_size
                );
                nixl.send_notification(self.agent, &remote.agent_name, notification.as_bytes())?;
                continue;
            }
            if local_ids.is_empty() {
                continue;
            }
            let aligned = if vllm_alignment {
                apply_prefix_caching(
                    &remote_ids,
                    &local_ids,
                    &groups,
                    engine.ppl * engine.sub_ratio,
                    self.reg.ppl,
                    self.cfg.defect,
                )
            } else {
                // Both lists count the smaller kernel's blocks here, so both
                // ppl do too.
                align_from_first_token(
                    &remote_ids,
                    &local_ids,
                    &groups,
                    &prefix_skip,
                    engine.ppl * engine.sub_ratio,
                    self.reg.ppl * ratio,
                    self.cfg.defect,
                )
            };
            let (remote_ids, local_ids) =
                aligned.map_err(|e| ConnectorError::Plan(e.to_string()))?;
            for (g, (l, r)) in local_ids.iter().zip(&remote_ids).enumerate() {
                if l.len() != r.len() {
                    return Err(ConnectorError::Plan(format!(
                        "push block-count mismatch group {g}: {} local vs {} remote blocks",
                        l.len(),
                        r.len()
                    )));
                }
            }
            let (local_desc_ids, remote_desc_ids) =
                self.desc_id_pair(&local_ids, &remote_ids, &engine, ratio)?;
            let mut notification = format!("{}:{}", req.remote_request_id, self.cfg.engine.tp_size);
            if self.cfg.defect != Some(Defect::PushEmptyRemoteIds) {
                let covered: Vec<String> = remote_ids
                    .iter()
                    .enumerate()
                    .filter(|(g, ids)| groups[*g] == GroupKind::Attention && !ids.is_empty())
                    .map(|(g, ids)| format!("{g}:{}", ids.len()))
                    .collect();
                notification.push_str(";covered=");
                notification.push_str(&covered.join(","));
            }
            let xfer = nixl.make_xfer(
                self.agent,
                XferOp::Write,
                local_handle,
                &local_desc_ids,
                remote.handle,
                &remote_desc_ids,
                Some(notification.as_bytes()),
            )?;
            nixl.post_xfer(self.agent, xfer)?;
            writes.push(PlannedRead {
                remote_rank: rank,
                local_block_ids: local_ids,
                remote_block_ids: remote_ids,
                local_desc_ids,
                remote_desc_ids,
                notification,
                xfer: Some(xfer),
            });
        }
        Ok(Sending {
            request: req.clone(),
            writes,
        })
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
        let one_way = self.cfg.defect == Some(Defect::PushOneWayRatio);
        let empty_ids = self.cfg.defect == Some(Defect::PushEmptyRemoteIds);
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
            defect: self.cfg.defect,
        }))
    }

    /// D side: apply the push post-process to this worker's memory.
    pub fn finish_push(
        &self,
        prefill_engine_id: &str,
        local_block_ids: &BlockIds,
        covered: &[(usize, u64)],
        memory: &mut dyn KvMemory,
    ) -> Result<Vec<GroupPostProcess>, ConnectorError> {
        let plans = self.plan_push_post_process(prefill_engine_id, local_block_ids, covered)?;
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
