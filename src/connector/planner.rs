//! The request planner: one pure function from a request's block ids and
//! both sides' list geometry to the descriptor ids of one transfer (kernel
//! expansion, the block-size-ratio mapping, clipping, the prefix alignment
//! chosen by the policy, desc ids). Pull, push and the `plan` fuzz target
//! all call [`plan_transfer`]; TP mapping (which groups a rank serves)
//! happens before it.

use super::block_mapping::{
    align_from_first_token, apply_prefix_caching, logical_to_kernel, map_for_block_size_ratio,
    pair_from_last_token, AlignError, BlockIds,
};
use super::desc_ids::{compute_desc_ids, ListShape};
use super::policy::{MambaExpansion, Policy, PrefixAlignment, RemoteIdExpansion};
use crate::geometry::{GroupKind, Mode};

/// One side's prepared list, as far as desc ids depend on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListGeometry {
    /// Kernel blocks per region of the side's pool.
    pub num_kernel_blocks: u64,
    /// Kernel blocks per logical block.
    pub ppl: u32,
}

/// Both sides of one transfer. The initiator posts it (decode in pull,
/// prefill in push); the peer is the other engine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransferGeometry {
    pub groups: Vec<GroupKind>,
    /// Regions (layer slots) of both lists.
    pub num_regions: u64,
    /// Mamba descriptor lists per side (state regions x sub-regions), 0 without mamba.
    pub num_state_lists: u64,
    pub initiator: ListGeometry,
    pub peer: ListGeometry,
    /// Initiator kernel / peer kernel (>= 1): the initiator's pages are
    /// addressed as this many peer-sized sub-blocks.
    pub ratio: u32,
    /// Push into larger decode pages: each peer page is addressed as this
    /// many initiator-sized sub-pages (1 otherwise).
    pub peer_sub_pages: u32,
    pub mode: Mode,
}

/// The request's blocks as the initiating rank sees them (groups it does not
/// serve already emptied).
#[derive(Clone, Copy, Debug)]
pub struct TransferBlocks<'a> {
    /// The initiator's logical block ids per group.
    pub initiator: &'a [Vec<u32>],
    /// The peer's logical block ids per group.
    pub peer: &'a [Vec<u32>],
    /// Per group, the entries of prefill's list (in units of the smaller
    /// kernel) holding tokens decode already has: its prefix hit.
    pub prefix_skip: &'a [usize],
    /// Prefill's transferred tokens in units of the peer's kernel block
    /// (`ceil(remote_num_tokens / peer kernel)`), when the request carries
    /// the count; only the last-token pairing reads it.
    pub peer_sub_blocks: Option<u64>,
}

/// The descriptor ids of one planned transfer. Position k of the local
/// ids pairs with position k of the remote ids.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransferIds {
    /// The initiator's ids per group after mapping and alignment, in units of
    /// the smaller kernel for attention, logical blocks for mamba.
    pub local_block_ids: BlockIds,
    pub remote_block_ids: BlockIds,
    pub local_desc_ids: Vec<u32>,
    pub remote_desc_ids: Vec<u32>,
}

/// What the planner decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlannedTransfer {
    /// Nothing to move (a full prefix hit, or no group served): only notify.
    NotifyOnly {
        local_block_ids: BlockIds,
        remote_block_ids: BlockIds,
    },
    Transfer(TransferIds),
}

/// The planner refused the request (vLLM raises an assertion here).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error(transparent)]
    Align(#[from] AlignError),
    #[error("push block-count mismatch group {group}: {local} local vs {remote} remote blocks")]
    PushBlockCount {
        group: usize,
        local: usize,
        remote: usize,
    },
    #[error("descriptor count mismatch: {local} local vs {remote} remote")]
    DescCount { local: usize, remote: usize },
    #[error("TP sizes do not divide: local {local}, remote {remote}")]
    TpNotDivisible { local: u32, remote: u32 },
    #[error(
        "Local block size {local} is not divisible by remote block size {remote} or vice versa."
    )]
    KernelNotDivisible { local: u32, remote: u32 },
    #[error("Only nP < nD supported currently.")]
    RemoteKernelLarger,
    #[error("no handshake with remote rank {rank}")]
    NoHandshake { rank: u32 },
    #[error("no local list for this remote geometry")]
    NoLocalList,
    #[error("no descriptor list was prepared for remote agent {agent}")]
    NoRemoteList { agent: String },
    #[error(
        "Declining remote reads: different P/D block sizes require remote_num_tokens in \
         kv_transfer_params (the proxy must forward it)"
    )]
    NoRemoteNumTokens,
}

/// The peer's logical ids as kernel ids (the policy picks which ppl),
/// split into sub-pages when the peer's pages are larger.
pub fn peer_kernel_ids(
    geometry: &TransferGeometry,
    peer: &[Vec<u32>],
    policy: &Policy,
) -> BlockIds {
    // The local-ppl expansion is a pull-side decision (`_read_blocks_for_req`).
    let ppl = match (policy.remote_id_expansion, geometry.mode) {
        (RemoteIdExpansion::LocalPpl, Mode::Pull) => geometry.initiator.ppl,
        _ => geometry.peer.ppl,
    };
    let mut ids = logical_to_kernel(peer, &geometry.groups, ppl);
    if geometry.peer_sub_pages > 1 {
        split_attention(&mut ids, &geometry.groups, geometry.peer_sub_pages);
    }
    ids
}

/// Each attention kernel id `k` becomes `k * n .. k * n + n`.
fn split_attention(ids: &mut [Vec<u32>], groups: &[GroupKind], n: u32) {
    for (group, kind) in ids.iter_mut().zip(groups) {
        if *kind == GroupKind::Attention {
            *group = group
                .iter()
                .flat_map(|&k| (0..n).map(move |q| k * n + q))
                .collect();
        }
    }
}

/// Plan one transfer of `blocks` between the two sides of `geometry`.
pub fn plan_transfer(
    geometry: &TransferGeometry,
    blocks: TransferBlocks<'_>,
    policy: &Policy,
) -> Result<PlannedTransfer, PlanError> {
    let groups = &geometry.groups;
    let ratio = geometry.ratio;
    let push = geometry.mode == Mode::Push;
    let sizes_differ = ratio > 1 || geometry.initiator.ppl != geometry.peer.ppl;
    let last_token = policy.prefix_alignment == PrefixAlignment::LastTokenWhenSizesDiffer;
    if last_token && !push && sizes_differ {
        return plan_from_last_token(geometry, blocks, policy);
    }
    // Equal block sizes and push end-trim under the last-token decision too.
    let end_trim = policy.prefix_alignment == PrefixAlignment::EndTrim || last_token;
    let mut local = logical_to_kernel(blocks.initiator, groups, geometry.initiator.ppl);
    let mut remote = peer_kernel_ids(geometry, blocks.peer, policy);
    if ratio > 1 && (!push || end_trim) {
        // The initiator's pages as peer-sized sub-blocks, clipped to the peer's list.
        (local, remote) = map_for_block_size_ratio(&local, &remote, groups, ratio);
    } else if ratio > 1 {
        // Not clipped: after a prefix hit decode's list starts later, and the
        // alignment drops prefill's cached entries from the front first.
        split_attention(&mut local, groups, ratio);
    }
    if geometry.peer_sub_pages > 1 {
        // Decode sub-pages past what prefill holds are not written (zeroed on D).
        for ((r, l), kind) in remote.iter_mut().zip(&local).zip(groups) {
            if *kind == GroupKind::Attention {
                r.truncate(l.len());
            }
        }
    }
    if local.iter().all(Vec::is_empty) {
        return Ok(PlannedTransfer::NotifyOnly {
            local_block_ids: local,
            remote_block_ids: remote,
        });
    }
    let tolerance = policy.prefix_count_tolerance;
    // Both lists count the smaller kernel's blocks, so both ppl do too.
    let initiator_ppl = geometry.initiator.ppl * ratio;
    let peer_ppl = geometry.peer.ppl * geometry.peer_sub_pages;
    let (local, remote) = match (push, end_trim) {
        (false, true) => apply_prefix_caching(
            &local,
            &remote,
            groups,
            geometry.initiator.ppl,
            geometry.peer.ppl,
            tolerance,
        )?,
        (false, false) => align_from_first_token(
            &local,
            &remote,
            groups,
            blocks.prefix_skip,
            initiator_ppl,
            geometry.peer.ppl,
            tolerance,
        )?,
        (true, true) => {
            let (r, l) = apply_prefix_caching(
                &remote,
                &local,
                groups,
                peer_ppl,
                geometry.initiator.ppl,
                tolerance,
            )?;
            (l, r)
        }
        (true, false) => {
            let (r, l) = align_from_first_token(
                &remote,
                &local,
                groups,
                blocks.prefix_skip,
                peer_ppl,
                initiator_ppl,
                tolerance,
            )?;
            (l, r)
        }
    };
    if push {
        for (g, (l, r)) in local.iter().zip(&remote).enumerate() {
            if l.len() != r.len() {
                return Err(PlanError::PushBlockCount {
                    group: g,
                    local: l.len(),
                    remote: r.len(),
                });
            }
        }
    }
    transfer_ids(geometry, local, remote, policy)
}

/// A pull across different block sizes paired from the last token, then
/// through the end-trim step as vLLM 0.34.0's `_read_blocks` runs it (a
/// no-op for the paired attention lists; state slots pair there).
fn plan_from_last_token(
    geometry: &TransferGeometry,
    blocks: TransferBlocks<'_>,
    policy: &Policy,
) -> Result<PlannedTransfer, PlanError> {
    let groups = &geometry.groups;
    let local = logical_to_kernel(blocks.initiator, groups, geometry.initiator.ppl);
    if local.iter().all(Vec::is_empty) {
        return Ok(PlannedTransfer::NotifyOnly {
            local_block_ids: local,
            remote_block_ids: peer_kernel_ids(geometry, blocks.peer, policy),
        });
    }
    let sub_blocks = blocks.peer_sub_blocks.ok_or(PlanError::NoRemoteNumTokens)?;
    let remote = peer_kernel_ids(geometry, blocks.peer, policy);
    let paired = pair_from_last_token(
        &local,
        &remote,
        groups,
        geometry.ratio,
        geometry.initiator.ppl,
        geometry.peer.ppl,
        sub_blocks,
    );
    if paired.local.iter().all(Vec::is_empty) {
        return Ok(PlannedTransfer::NotifyOnly {
            local_block_ids: paired.local,
            remote_block_ids: paired.remote,
        });
    }
    let (local, remote) = apply_prefix_caching(
        &paired.local,
        &paired.remote,
        groups,
        geometry.initiator.ppl,
        geometry.peer.ppl,
        policy.prefix_count_tolerance,
    )?;
    transfer_ids(geometry, local, remote, policy)
}

/// The descriptor ids of the aligned lists.
fn transfer_ids(
    geometry: &TransferGeometry,
    local: BlockIds,
    remote: BlockIds,
    policy: &Policy,
) -> Result<PlannedTransfer, PlanError> {
    let groups = &geometry.groups;
    let ratio = geometry.ratio;
    let shape = |side: &ListGeometry, ratio: Option<u32>| ListShape {
        num_regions: geometry.num_regions,
        num_kernel_blocks: side.num_kernel_blocks,
        ratio,
        ppl: side.ppl,
        num_state_lists: geometry.num_state_lists,
    };
    let peer_ratio = (geometry.peer_sub_pages > 1).then_some(geometry.peer_sub_pages);
    let remote_desc_ids = compute_desc_ids(
        &remote,
        groups,
        shape(&geometry.peer, peer_ratio),
        MambaExpansion::OnePerLogicalBlock,
    );
    let local_desc_ids = compute_desc_ids(
        &local,
        groups,
        shape(&geometry.initiator, Some(ratio)),
        policy.mamba_expansion,
    );
    if local_desc_ids.len() != remote_desc_ids.len() {
        return Err(PlanError::DescCount {
            local: local_desc_ids.len(),
            remote: remote_desc_ids.len(),
        });
    }
    Ok(PlannedTransfer::Transfer(TransferIds {
        local_block_ids: local,
        remote_block_ids: remote,
        local_desc_ids,
        remote_desc_ids,
    }))
}
