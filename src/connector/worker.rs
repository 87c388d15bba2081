//! One connector worker (one TP rank of one engine): registration, the
//! handshake with remote ranks, and the descriptor lists it prepares.
//! Request planning lives in `pull.rs` and `push.rs`.

use std::collections::BTreeMap;

use super::conv_split::{conv_pieces, remote_conv_offsets, ConvPeer, RankAt};
use super::handshake::{self, HandshakeError, LocalSide};
use super::local_lists;
use super::metadata::HandshakeMetadata;
use super::planner::{ListGeometry, PlanError, TransferGeometry};
use super::policy::{
    ConvSplit, DecodePushHandshake, PaddedPageRegistration, Policy, PushRatioDirection,
    SplitListKey,
};
use super::post_process::PageGeometry;
use super::registration::{KvTensor, Registration};
use super::remote_lists;
use super::role::Role;
use super::split_lists::split_lists;
use super::tp_mapping::{model_tp_mapping, TpMapping};
use crate::geometry::CompatFactors;
use crate::geometry::{
    block_size_ratio, tp_ratio, EngineGeometry, GroupKind, Mode, ModelSpec, SubRegion,
};
use crate::nixl::{AgentId, DescList, DlistHandle, DlistTarget, MemKind, Nixl, NixlError};

/// Everything a worker is configured with.
#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// The engine this worker belongs to.
    pub engine_id: String,
    /// The NIXL agent name peers see.
    pub agent_name: String,
    /// The model the engine serves.
    pub model: ModelSpec,
    /// The engine's block geometry.
    pub engine: EngineGeometry,
    /// Logical blocks in this rank's pool.
    pub num_logical_blocks: u32,
    /// This worker's TP rank.
    pub tp_rank: u32,
    /// Which engine the worker belongs to and whether it reads or is written to.
    pub role: Role,
    /// Memory type of the registered tensors (and of the own local list).
    pub mem: MemKind,
    /// The platform's NIXL memory type, used by vLLM for every list prepared
    /// at handshake (block-size, split and remote lists). Equal to `mem`
    /// except where a platform reports device memory over host tensors.
    pub platform_mem: MemKind,
    /// Device ordinal of the registered tensors.
    pub device: u32,
    /// The connector's decisions (`Policy::default()`: kvgeom's).
    pub policy: Policy,
    /// What this engine's handshake compatibility hash covers that a pair
    /// can differ in, as it advertises it; `None` advertises nothing and
    /// checks nothing (a replayed trace, which recorded no hash).
    pub compat_factors: Option<CompatFactors>,
    /// `enforce_handshake_compat`: refuse a peer whose factors differ.
    pub enforce_compat: bool,
}

/// Errors of the connector.
#[derive(Debug, thiserror::Error)]
pub enum ConnectorError {
    #[error(transparent)]
    /// A NIXL call failed.
    Nixl(#[from] NixlError),
    #[error("handshake refused: {0}")]
    /// The handshake refused the peer.
    Handshake(#[from] HandshakeError),
    #[error("transfer planning refused: {0}")]
    /// Planning a transfer failed.
    Plan(#[from] PlanError),
    #[error("completing the receive failed: {0}")]
    /// Completing a pushed receive fails where vLLM raises (the text of its exception).
    Completion(String),
    #[error("registration refused: {0}")]
    /// Registering the KV tensors failed where vLLM raises.
    Registration(String),
    #[error("unknown remote engine {0}")]
    /// No handshake was done with this engine id.
    UnknownEngine(String),
}

/// A remote engine after at least one rank's handshake.
#[derive(Clone, Debug)]
pub struct RemoteEngine {
    pub tp_size: u32,
    /// Remote kernel block size (after gcd splitting).
    pub block_size: u32,
    pub ppl: u32,
    pub num_blocks: u64,
    /// Push with a larger decode kernel: D's kernel pages are viewed as this
    /// many prefill-sized sub-pages (1 otherwise).
    pub sub_ratio: u32,
    pub mapping: TpMapping,
    pub ranks: BTreeMap<u32, RemoteRank>,
}

/// One handshaken remote rank.
#[derive(Clone, Debug)]
pub struct RemoteRank {
    pub agent_name: String,
    /// The remote rank's list as prepared here; `None` for a push peer that
    /// decode only records (vLLM 0.33.0's push handshake on decode).
    pub list: Option<RemoteList>,
    pub metadata: HandshakeMetadata,
}

/// A remote rank's descriptor list, prepared against the local agent.
#[derive(Clone, Debug)]
pub struct RemoteList {
    pub handle: DlistHandle,
    pub descs: DescList,
}

impl RemoteRank {
    /// The prepared list's handle, or the planning error saying there is none.
    pub fn handle(&self) -> Result<DlistHandle, PlanError> {
        self.list
            .as_ref()
            .map(|l| l.handle)
            .ok_or_else(|| PlanError::NoRemoteList {
                agent: self.agent_name.clone(),
            })
    }
}

/// A remote rank's metadata as the checks see it, and what follows from it.
struct CheckedPeer {
    /// The metadata, with larger MLA-hybrid remote blocks split (what the
    /// remote list is built from).
    meta: HandshakeMetadata,
    /// What the checks compare: decode seen as prefill-sized sub-pages when
    /// kvgeom pushes into larger decode kernel blocks.
    checked: HandshakeMetadata,
    sub_ratio: u32,
    tp_ratio: i32,
    ratio: u32,
    mapping: TpMapping,
}

/// Key of a set of per-source split lists: (tp_ratio, remote kernel block).
pub type SplitKey = (i32, u32);

/// vLLM 0.33.0's registration of padded pages: a layer's view must be whole
/// runs of padded blocks, which it is only when the layer is alone in the
/// allocation (then its last block's padding ends the allocation).
fn refuse_padded_shared_pages(
    cfg: &WorkerConfig,
    tensors: &[KvTensor],
) -> Result<(), ConnectorError> {
    let padding = cfg.engine.block_padding_bytes;
    if cfg.policy.padded_pages != PaddedPageRegistration::RefusedWhenShared
        || padding == 0
        || tensors.len() < 2
    {
        return Ok(());
    }
    let page = cfg.engine.kernel_page_bytes(&cfg.model);
    Err(ConnectorError::Registration(format!(
        "KV cache view cannot be partitioned into NIXL regions: {} layer slots share one allocation \
         and each kernel page of {page} bytes is padded to {} (block_padding_bytes {padding})",
        tensors.len(),
        page + padding
    )))
}

/// One connector worker.
#[derive(Debug)]
pub struct Worker {
    pub(crate) cfg: WorkerConfig,
    pub(crate) agent: AgentId,
    pub(crate) reg: Registration,
    /// Local lists by the remote kernel block size they serve (own size first).
    pub(crate) lists_by_block_size: BTreeMap<u32, (DlistHandle, DescList)>,
    pub(crate) split_handles: BTreeMap<SplitKey, Vec<(DlistHandle, DescList)>>,
    /// Push with `P_TP > D_TP` and replicated Mamba2 groups: this prefill
    /// rank's list with only its share of the groups, by split key.
    pub(crate) share_lists: BTreeMap<SplitKey, (DlistHandle, DescList)>,
    pub(crate) remotes: BTreeMap<String, RemoteEngine>,
}

impl Worker {
    /// Create the agent, register the tensors and prepare the own local list.
    pub fn register(
        nixl: &mut dyn Nixl,
        cfg: WorkerConfig,
        tensors: &[KvTensor],
    ) -> Result<Self, ConnectorError> {
        refuse_padded_shared_pages(&cfg, tensors)?;
        let agent = nixl.create_agent(&cfg.agent_name)?;
        let reg = Registration::new(
            &cfg.model,
            &cfg.engine,
            cfg.num_logical_blocks,
            tensors,
            cfg.mem,
            cfg.device,
        );
        nixl.register_memory(agent, &reg.memory)?;
        let own = local_lists::local_list(&reg, 1, cfg.policy);
        let handle = nixl.prepare_dlist(agent, &DlistTarget::Local, cfg.mem, &own)?;
        let mut lists_by_block_size = BTreeMap::new();
        lists_by_block_size.insert(reg.kernel_block, (handle, own));
        Ok(Worker {
            cfg,
            agent,
            reg,
            lists_by_block_size,
            split_handles: BTreeMap::new(),
            share_lists: BTreeMap::new(),
            remotes: BTreeMap::new(),
        })
    }

    /// The worker's NIXL agent.
    pub fn agent(&self) -> AgentId {
        self.agent
    }

    /// What the worker was configured with.
    pub fn config(&self) -> &WorkerConfig {
        &self.cfg
    }

    /// The worker's registered regions and block geometry.
    pub fn registration(&self) -> &Registration {
        &self.reg
    }

    /// A handshaken remote engine, by id.
    pub fn remote(&self, engine_id: &str) -> Option<&RemoteEngine> {
        self.remotes.get(engine_id)
    }

    /// A handshaken remote engine, or the error naming the unknown one.
    pub(crate) fn remote_engine(&self, engine_id: &str) -> Result<&RemoteEngine, ConnectorError> {
        self.remotes
            .get(engine_id)
            .ok_or_else(|| ConnectorError::UnknownEngine(engine_id.to_string()))
    }

    /// The model's KV-cache groups, in order.
    pub fn groups(&self) -> &[GroupKind] {
        &self.cfg.model.groups
    }

    pub(crate) fn first_attention_group(&self) -> usize {
        self.cfg
            .model
            .first_group(GroupKind::Attention)
            .unwrap_or(0)
    }

    /// Every descriptor list this worker prepared, with what it is for, in
    /// a stable order: local lists by block size, split lists, remote lists.
    pub fn prepared_lists(&self) -> Vec<(String, DlistHandle, &DescList)> {
        let mut out = Vec::new();
        let own_first = self
            .lists_by_block_size
            .iter()
            .filter(|(s, _)| **s == self.reg.kernel_block);
        let others = self
            .lists_by_block_size
            .iter()
            .filter(|(s, _)| **s != self.reg.kernel_block);
        for (size, (h, list)) in own_first.chain(others) {
            let label = if *size == self.reg.kernel_block {
                format!("local, own {size}-token kernel blocks")
            } else {
                format!("local, split into {size}-token remote blocks")
            };
            out.push((label, *h, list));
        }
        for ((t, size), lists) in &self.split_handles {
            for (position, (h, list)) in lists.iter().enumerate() {
                out.push((
                    format!(
                        "local split for source #{position} (tp_ratio {t}, remote block {size})"
                    ),
                    *h,
                    list,
                ));
            }
        }
        for ((t, size), (h, list)) in &self.share_lists {
            out.push((
                format!("local share of replicated groups (tp_ratio {t}, remote block {size})"),
                *h,
                list,
            ));
        }
        for (engine, remote) in &self.remotes {
            for (rank, r) in &remote.ranks {
                if let Some(list) = &r.list {
                    out.push((
                        format!("remote {engine} rank {rank} ({})", r.agent_name),
                        list.handle,
                        &list.descs,
                    ));
                }
            }
        }
        out
    }

    /// The metadata this rank publishes for its peers.
    pub fn metadata(&self, nixl: &mut dyn Nixl) -> Result<HandshakeMetadata, ConnectorError> {
        Ok(HandshakeMetadata {
            engine_id: self.cfg.engine_id.clone(),
            agent_metadata: nixl.local_metadata(self.agent)?,
            device_id: self.cfg.device,
            kv_caches_base_addr: self.reg.base_addresses(),
            num_blocks: self.reg.num_kernel_blocks,
            block_lens: self.reg.block_lens(),
            block_strides: self.reg.block_strides(),
            kv_cache_layout: self.cfg.engine.layout,
            block_size: self.reg.kernel_block,
            ssm_sizes: self.reg.ssm_sizes,
            physical_blocks_per_logical_kv_block: self.reg.ppl,
            host_buffer: self.cfg.engine.host_buffer,
            region_mem_types: Some(vec![self.reg.mem; self.reg.num_regions()]),
            compat_factors: self.cfg.compat_factors.clone(),
        })
    }

    /// Byte geometry of each region's attention pages (for the post-process).
    pub fn page_geometries(&self) -> Vec<PageGeometry> {
        (0..self.reg.num_regions())
            .map(|r| {
                PageGeometry::new(
                    &self.cfg.model,
                    &self.reg,
                    self.cfg.engine.tp_size,
                    self.cfg.engine.layout,
                    r,
                )
            })
            .collect()
    }

    /// The remote ranks this rank handshakes with.
    pub fn handshake_targets(&self, remote_tp: u32) -> Result<Vec<u32>, HandshakeError> {
        let t =
            tp_ratio(self.cfg.engine.tp_size, remote_tp).ok_or(HandshakeError::TpNotDivisible {
                local: self.cfg.engine.tp_size,
                remote: remote_tp,
            })?;
        let rank = self.cfg.tp_rank;
        Ok(if t > 0 {
            vec![rank / t as u32]
        } else {
            let n = t.unsigned_abs();
            (rank * n..(rank + 1) * n).collect()
        })
    }

    /// Add one remote rank (vLLM's `add_remote_agent`): check the pair,
    /// prepare the local lists it needs, prepare the remote rank's list, and
    /// record the rank.
    pub fn add_remote_agent(
        &mut self,
        nixl: &mut dyn Nixl,
        meta: &HandshakeMetadata,
        remote_rank: u32,
        remote_tp: u32,
    ) -> Result<String, ConnectorError> {
        if let Some(r) = self
            .remotes
            .get(&meta.engine_id)
            .and_then(|e| e.ranks.get(&remote_rank))
        {
            return Ok(r.agent_name.clone());
        }
        self.check_compatibility_hash(meta)?;
        if self.cfg.role.mode() == Mode::Push {
            handshake::check_push_block_sizes(&self.cfg.policy, &self.reg, meta)?;
        }
        let views = self.peer_views(meta, remote_tp)?;
        let agent_name = nixl.add_remote_agent(self.agent, &meta.agent_metadata)?;
        let peer = self.check_pair(views, remote_tp)?;
        self.prepare_local_lists(nixl, &peer, remote_tp)?;
        let list = self.prepare_remote_list(nixl, &peer, &agent_name, remote_rank, remote_tp)?;
        self.record_remote(remote_rank, remote_tp, peer, &agent_name, Some(list));
        Ok(agent_name)
    }

    /// The compatibility hash, first of the handshake's checks (vLLM
    /// compares it before it decodes the agent metadata): refused when the
    /// check is on and a factor both sides advertise differs.
    fn check_compatibility_hash(&self, meta: &HandshakeMetadata) -> Result<(), HandshakeError> {
        let (true, Some(local), Some(remote)) = (
            self.cfg.enforce_compat,
            &self.cfg.compat_factors,
            &meta.compat_factors,
        ) else {
            return Ok(());
        };
        let differences = local.differences(self.cfg.role.engine(), remote);
        if differences.is_empty() {
            Ok(())
        } else {
            Err(HandshakeError::CompatibilityHashMismatch { differences })
        }
    }

    /// The views of a remote rank's metadata the checks and lists use, the
    /// TP ratio and the TP mapping (no check of the block sizes yet).
    fn peer_views(
        &self,
        meta: &HandshakeMetadata,
        remote_tp: u32,
    ) -> Result<CheckedPeer, HandshakeError> {
        let model = &self.cfg.model;
        let writer = self.cfg.role == Role::PushWriter;
        let own_push =
            writer && self.cfg.policy.push.ratio_direction == PushRatioDirection::BothDirections;
        let meta = if model.has_mamba() && model.is_mla() && !writer {
            handshake::split_remote_blocks(self.reg.kernel_block, meta)
        } else {
            meta.clone()
        };
        let (checked, sub_ratio) = if own_push && meta.block_size > self.reg.kernel_block {
            handshake::view_as_sub_pages(self.reg.kernel_block, &meta)?
        } else {
            (meta.clone(), 1)
        };
        let tp_ratio = handshake::tp_ratio(self.cfg.engine.tp_size, remote_tp)?;
        let mapping = model_tp_mapping(model, self.cfg.tp_rank, self.cfg.engine.tp_size, remote_tp);
        Ok(CheckedPeer {
            meta,
            checked,
            sub_ratio,
            tp_ratio,
            ratio: 0,
            mapping,
        })
    }

    /// Every handshake check (`handshake.rs`) on a remote rank's views.
    fn check_pair(
        &self,
        mut peer: CheckedPeer,
        remote_tp: u32,
    ) -> Result<CheckedPeer, HandshakeError> {
        peer.ratio = handshake::kernel_ratio(self.reg.kernel_block, peer.checked.block_size)?;
        let first_num_blocks = self
            .remotes
            .get(&peer.meta.engine_id)
            .map_or(peer.meta.num_blocks, |e| e.num_blocks);
        let gathers_heads =
            peer.mapping.source_ranks_per_group[self.first_attention_group()].len() > 1;
        handshake::validate(
            &LocalSide {
                model: &self.cfg.model,
                reg: &self.reg,
                tp_size: self.cfg.engine.tp_size,
                layout: self.cfg.engine.layout,
                host_buffer: self.cfg.engine.host_buffer,
                prefix_caching: self.cfg.engine.prefix_caching,
                policy: self.cfg.policy,
            },
            &handshake::RemoteSide {
                meta: &peer.checked,
                tp_size: remote_tp,
                tp_ratio: peer.tp_ratio,
                kernel_ratio: peer.ratio,
                first_num_blocks: first_num_blocks * u64::from(peer.sub_ratio),
                gathers_heads,
            },
        )?;
        Ok(peer)
    }

    /// The local lists transfers with this peer use: at the peer's kernel
    /// granularity (kernel ratio), and per source rank (multi-read).
    fn prepare_local_lists(
        &mut self,
        nixl: &mut dyn Nixl,
        peer: &CheckedPeer,
        remote_tp: u32,
    ) -> Result<(), ConnectorError> {
        let (t, ratio) = (peer.tp_ratio, peer.ratio);
        let remote_block = peer.checked.block_size;
        if ratio > 1 && !self.lists_by_block_size.contains_key(&remote_block) {
            let list = local_lists::local_list(&self.reg, ratio, self.cfg.policy);
            // Like the own list, in the regions' type (vLLM's
            // `register_local_xfer_handler`), not the platform's.
            let handle =
                nixl.prepare_dlist(self.agent, &DlistTarget::Local, self.cfg.mem, &list)?;
            self.lists_by_block_size
                .insert(remote_block, (handle, list));
        }
        let key = self.split_key(t, remote_block);
        self.prepare_share_list(nixl, peer, remote_tp, key)?;
        if !self.needs_split_lists(t, &peer.mapping) || self.split_handles.contains_key(&key) {
            return Ok(());
        }
        // Keyed by the TP ratio alone, the lists are built at the own (ratio 1) granularity.
        let local_granularity = self.cfg.policy.split_list_key == SplitListKey::RatioOnly;
        let (src, num_fa, split_ratio) = if local_granularity {
            (
                &self.lists_by_block_size[&self.reg.kernel_block].1,
                self.reg.num_descs(),
                1,
            )
        } else {
            let own = if ratio > 1 {
                &remote_block
            } else {
                &self.reg.kernel_block
            };
            (
                &self.lists_by_block_size[own].1,
                self.reg.num_descs() * u64::from(ratio),
                ratio,
            )
        };
        let conv = self.split_conv_pieces(peer, remote_tp);
        let lists = split_lists(
            &self.reg,
            &peer.mapping,
            &self.cfg.model.groups,
            src,
            num_fa,
            split_ratio,
            conv.as_deref(),
            self.cfg.policy.split_head_slot,
        )
        .map_err(HandshakeError::from)?;
        let mut handles = Vec::new();
        for list in lists {
            let h = nixl.prepare_dlist(
                self.agent,
                &DlistTarget::Local,
                self.cfg.platform_mem,
                &list,
            )?;
            handles.push((h, list));
        }
        self.split_handles.insert(key, handles);
        Ok(())
    }

    /// How this rank exchanges conv state with `remote_rank` of an engine of
    /// `remote_tp` ranks: the destination's sources, and this one's position
    /// among them (the position in the per-source lists when decode reads
    /// from several prefill ranks; among the prefill ranks writing one
    /// decode rank in push).
    fn conv_peer(&self, peer: &CheckedPeer, remote_rank: u32, remote_tp: u32) -> ConvPeer {
        let t = peer.tp_ratio;
        let local_is_destination = self.cfg.role.is_decode();
        let (position, ranks) = match (local_is_destination, t < 0) {
            (true, true) => (
                peer.mapping
                    .all_source_ranks
                    .iter()
                    .position(|&r| r == remote_rank)
                    .unwrap_or(0) as u32,
                t.unsigned_abs(),
            ),
            (false, false) => (self.cfg.tp_rank % t.unsigned_abs(), t.unsigned_abs()),
            _ => (0, 1),
        };
        ConvPeer {
            local: RankAt {
                tp_size: self.cfg.engine.tp_size,
                tp_rank: self.cfg.tp_rank,
            },
            peer: RankAt {
                tp_size: remote_tp,
                tp_rank: remote_rank,
            },
            local_is_destination,
            position,
            ranks,
        }
    }

    /// Under [`ConvSplit::PeerWidths`], the local piece of each conv
    /// sub-projection per source position of the split lists; `None` splits
    /// every state sub-region evenly (vLLM 0.33.0).
    fn split_conv_pieces(&self, peer: &CheckedPeer, remote_tp: u32) -> Option<Vec<Vec<SubRegion>>> {
        let spec = self.cfg.model.mamba.as_ref()?;
        if self.cfg.policy.conv_split != ConvSplit::PeerWidths || !self.reg.has_mamba() {
            return None;
        }
        Some(
            peer.mapping
                .all_source_ranks
                .iter()
                .map(|&r| {
                    conv_pieces(spec, &self.conv_peer(peer, r, remote_tp))
                        .iter()
                        .map(|c| c.local)
                        .collect()
                })
                .collect(),
        )
    }

    /// Push with `P_TP > D_TP` under [`ConvSplit::PeerWidths`]: when this
    /// prefill rank moves only a share of its conv state (replicated Mamba2
    /// groups that the other writers of the decode rank hold too), the list
    /// its WRITEs use, with those sub-projections narrowed to the share.
    fn prepare_share_list(
        &mut self,
        nixl: &mut dyn Nixl,
        peer: &CheckedPeer,
        remote_tp: u32,
        key: SplitKey,
    ) -> Result<(), ConnectorError> {
        let t = peer.tp_ratio;
        let Some(spec) = self.cfg.model.mamba.as_ref() else {
            return Ok(());
        };
        if self.cfg.role != Role::PushWriter
            || t <= 1
            || self.cfg.policy.conv_split != ConvSplit::PeerWidths
            || !self.reg.has_mamba()
            || self.share_lists.contains_key(&key)
        {
            return Ok(());
        }
        let target = self.cfg.tp_rank / t.unsigned_abs();
        let pieces: Vec<SubRegion> = conv_pieces(spec, &self.conv_peer(peer, target, remote_tp))
            .iter()
            .map(|c| c.local)
            .collect();
        if pieces == self.reg.conv_offsets {
            return Ok(());
        }
        let remote_block = peer.checked.block_size;
        let base = if self.lists_by_block_size.contains_key(&remote_block) {
            &self.lists_by_block_size[&remote_block].1
        } else {
            &self.lists_by_block_size[&self.reg.kernel_block].1
        };
        // The state runs close the list: per SSM region, each conv
        // sub-projection, then the SSM state.
        let per_region = self.reg.conv_offsets.len() + 1;
        let first_state = base.runs().len() - self.state_lists() as usize;
        let runs = base.runs().iter().enumerate().map(|(i, run)| {
            let mut run = *run;
            if let Some(k) = i.checked_sub(first_state) {
                if let Some(piece) = pieces.get(k % per_region) {
                    let sub = self.reg.conv_offsets[k % per_region];
                    run.addr = run.addr - sub.offset + piece.offset;
                    run.len = piece.size;
                }
            }
            run
        });
        let list = DescList::from_runs(runs.collect::<Vec<_>>());
        let handle = nixl.prepare_dlist(
            self.agent,
            &DlistTarget::Local,
            self.cfg.platform_mem,
            &list,
        )?;
        self.share_lists.insert(key, (handle, list));
        Ok(())
    }

    /// The list a push WRITE to an engine `t` ranks narrower uses when this
    /// rank moves only a share of replicated groups.
    pub(crate) fn share_handle(&self, t: i32, remote_block: u32) -> Option<DlistHandle> {
        self.share_lists
            .get(&self.split_key(t, remote_block))
            .map(|(h, _)| *h)
    }

    /// The remote rank's list, prepared against its agent.
    fn prepare_remote_list(
        &self,
        nixl: &mut dyn Nixl,
        peer: &CheckedPeer,
        agent_name: &str,
        remote_rank: u32,
        remote_tp: u32,
    ) -> Result<RemoteList, ConnectorError> {
        let conv = match &self.cfg.model.mamba {
            Some(spec) if self.reg.has_mamba() => remote_conv_offsets(
                self.cfg.policy.conv_split,
                spec,
                &self.conv_peer(peer, remote_rank, remote_tp),
                peer.tp_ratio,
            ),
            _ => Vec::new(),
        };
        let descs = remote_lists::remote_list(
            &self.reg,
            &peer.mapping,
            self.first_attention_group(),
            self.cfg.tp_rank,
            &peer.meta,
            peer.ratio,
            peer.sub_ratio,
            peer.tp_ratio,
            &conv,
        );
        // The peer's advertised region type (the handshake refused mixed
        // ones), else the platform's.
        let mem = peer
            .meta
            .region_mem_types
            .as_ref()
            .and_then(|types| types.first().copied())
            .unwrap_or(self.cfg.platform_mem);
        let handle = nixl.prepare_dlist(
            self.agent,
            &DlistTarget::Remote(agent_name.to_string()),
            mem,
            &descs,
        )?;
        Ok(RemoteList { handle, descs })
    }

    /// Record a handshaken rank (the engine on its first rank).
    fn record_remote(
        &mut self,
        remote_rank: u32,
        remote_tp: u32,
        peer: CheckedPeer,
        agent_name: &str,
        list: Option<RemoteList>,
    ) {
        let engine = self
            .remotes
            .entry(peer.meta.engine_id.clone())
            .or_insert_with(|| RemoteEngine {
                tp_size: remote_tp,
                block_size: peer.checked.block_size,
                ppl: peer.meta.physical_blocks_per_logical_kv_block,
                num_blocks: peer.meta.num_blocks,
                sub_ratio: peer.sub_ratio,
                mapping: peer.mapping,
                ranks: BTreeMap::new(),
            });
        engine.ranks.insert(
            remote_rank,
            RemoteRank {
                agent_name: agent_name.to_string(),
                list,
                metadata: peer.meta,
            },
        );
    }

    /// D side of a push: learn the prefill engine from one of its ranks.
    /// Under kvgeom's protocol decode validates the pair exactly as a pull
    /// would (so push is accepted when pull is); under vLLM 0.33.0's it only
    /// records the engine for notifications, and prepares no list.
    pub fn add_push_peer(
        &mut self,
        nixl: &mut dyn Nixl,
        meta: &HandshakeMetadata,
        remote_rank: u32,
        remote_tp: u32,
    ) -> Result<String, ConnectorError> {
        if self.cfg.policy.push.decode_handshake == DecodePushHandshake::Validated {
            return self.add_remote_agent(nixl, meta, remote_rank, remote_tp);
        }
        self.check_compatibility_hash(meta)?;
        handshake::check_push_block_sizes(&self.cfg.policy, &self.reg, meta)?;
        let agent_name = nixl.add_remote_agent(self.agent, &meta.agent_metadata)?;
        let model = &self.cfg.model;
        let peer = CheckedPeer {
            meta: meta.clone(),
            checked: meta.clone(),
            sub_ratio: 1,
            tp_ratio: 0,
            ratio: 0,
            mapping: model_tp_mapping(model, self.cfg.tp_rank, self.cfg.engine.tp_size, remote_tp),
        };
        self.record_remote(remote_rank, remote_tp, peer, &agent_name, None);
        Ok(agent_name)
    }

    /// Mamba descriptor lists per side: SSM regions x (conv projections + 1).
    pub(crate) fn state_lists(&self) -> u64 {
        if self.reg.has_mamba() {
            (self.reg.ssm_regions.len() * (self.reg.conv_offsets.len() + 1)) as u64
        } else {
            0
        }
    }

    /// The TP ratio towards a remote engine of `remote_tp` ranks.
    pub(crate) fn tp_ratio_to(&self, remote_tp: u32) -> Result<i32, PlanError> {
        let local = self.cfg.engine.tp_size;
        tp_ratio(local, remote_tp).ok_or(PlanError::TpNotDivisible {
            local,
            remote: remote_tp,
        })
    }

    /// Both sides' list geometry for transfers with `engine` (this worker initiates).
    pub(crate) fn transfer_geometry(
        &self,
        engine: &RemoteEngine,
        mode: Mode,
    ) -> Result<TransferGeometry, PlanError> {
        let ratio = block_size_ratio(self.reg.kernel_block, engine.block_size).ok_or(
            PlanError::KernelNotDivisible {
                local: self.reg.kernel_block,
                remote: engine.block_size,
            },
        )?;
        Ok(TransferGeometry {
            groups: self.cfg.model.groups.clone(),
            num_regions: self.reg.num_regions() as u64,
            num_state_lists: self.state_lists(),
            initiator: ListGeometry {
                num_kernel_blocks: self.reg.num_kernel_blocks,
                ppl: self.reg.ppl,
            },
            peer: ListGeometry {
                num_kernel_blocks: engine.num_blocks,
                ppl: engine.ppl,
            },
            ratio,
            peer_sub_pages: engine.sub_ratio,
            mode,
        })
    }

    pub(crate) fn split_key(&self, t: i32, remote_block: u32) -> SplitKey {
        if self.cfg.policy.split_list_key == SplitListKey::RatioOnly {
            (t, 0)
        } else {
            (t, remote_block)
        }
    }

    pub(crate) fn needs_split_lists(&self, t: i32, mapping: &TpMapping) -> bool {
        t < 0 && (!self.cfg.model.is_mla() || mapping.all_source_ranks.len() > 1)
    }

    /// The local list a transfer to/from remote source position `position` uses.
    pub(crate) fn local_handle(
        &self,
        t: i32,
        remote_block: u32,
        position: usize,
        specs: usize,
    ) -> Option<DlistHandle> {
        if t < 0 && (!self.cfg.model.is_mla() || specs > 1) {
            self.split_handles
                .get(&self.split_key(t, remote_block))
                .and_then(|v| v.get(position))
                .map(|(h, _)| *h)
        } else {
            let key = if self.lists_by_block_size.contains_key(&remote_block) {
                remote_block
            } else {
                self.reg.kernel_block
            };
            self.lists_by_block_size.get(&key).map(|(h, _)| *h)
        }
    }
}
