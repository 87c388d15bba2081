//! [`PlanInput`]: arbitrary requests for the connector's request planner
//! (`connector::planner::plan_transfer`, the function pull and push call),
//! with two descriptor-level checks: every descriptor id lies inside the
//! list it addresses, and every attention pair starts at the same token on
//! both sides (decode's list begins after its prefix hit, prefill's at the
//! first token).

use std::fmt;

use arbitrary::{Arbitrary, Result, Unstructured};

use crate::connector::block_mapping::{logical_to_kernel, BlockIds};
use crate::connector::planner::{
    plan_transfer, ListGeometry, PlannedTransfer, TransferBlocks, TransferGeometry, TransferIds,
};
use crate::connector::Policy;
use crate::geometry::{GroupKind, Mode};

/// KV-cache groups of the model.
pub const MAX_PLAN_GROUPS: usize = 4;
/// Regions (layer slots) of each list.
pub const MAX_PLAN_REGIONS: u64 = 4;
/// Logical blocks in each side's pool.
pub const MAX_PLAN_POOL: u32 = 24;
/// Largest drawn ppl (kernel blocks per logical block) of each side.
pub const MAX_PLAN_PPL: u32 = 8;
/// Kernel-block ratio between the two sides.
pub const MAX_PLAN_RATIO: u32 = 4;
/// Mamba descriptor lists per side (state regions x sub-regions).
pub const MAX_PLAN_STATE_LISTS: u64 = 8;

/// One side of a planned transfer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanSide {
    /// Logical blocks in the pool of each region.
    pub pool: u32,
    /// Kernel blocks per logical block.
    pub ppl: u32,
    /// The request's logical block ids per group, each below `pool`.
    pub block_ids: BlockIds,
}

impl PlanSide {
    fn kernel_blocks(&self) -> u64 {
        u64::from(self.pool) * u64::from(self.ppl)
    }
}

/// A request to plan: the groups, both sides' pools and ids, and the
/// kernel-block relation between the sides.
#[derive(Clone, PartialEq, Eq)]
pub struct PlanInput {
    /// The KV-cache groups, in transfer order.
    pub groups: Vec<GroupKind>,
    /// Regions (layer slots) of each list.
    pub num_regions: u64,
    /// Mamba descriptor lists per side; 0 without a mamba group.
    pub state_lists: u64,
    /// The initiator's side: decode in pull, prefill in push.
    pub local: PlanSide,
    /// The peer's side.
    pub remote: PlanSide,
    /// Push writes into decode pages: local kernel / remote kernel (>= 1).
    /// Pull reads: the same ratio, decode's kernel over prefill's.
    pub ratio: u32,
    /// Push only: remote (decode) pages seen as this many local-sized sub-pages.
    pub sub_pages: u32,
    /// Plan a push (WRITE) rather than a pull (READ).
    pub push: bool,
    /// Decode's prefix hit, in entries of the smaller kernel (every attention group).
    pub prefix_skip: u32,
}

/// A planned request whose ids leave the list they address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanFinding(pub String);

impl fmt::Display for PlanFinding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn draw_side(u: &mut Unstructured<'_>, groups: usize) -> Result<PlanSide> {
    let pool = u.int_in_range(1..=MAX_PLAN_POOL)?;
    let ppl = u.int_in_range(1..=MAX_PLAN_PPL)?;
    // A request never holds a block twice: each group draws distinct ids.
    let block_ids = (0..groups)
        .map(|_| {
            let n = u.int_in_range(0..=pool)?;
            let mut free: Vec<u32> = (0..pool).collect();
            (0..n)
                .map(|_| {
                    let i = u.choose_index(free.len())?;
                    Ok(free.swap_remove(i))
                })
                .collect()
        })
        .collect::<Result<_>>()?;
    Ok(PlanSide {
        pool,
        ppl,
        block_ids,
    })
}

impl<'a> Arbitrary<'a> for PlanInput {
    fn arbitrary(u: &mut Unstructured<'a>) -> Result<Self> {
        let n = u.int_in_range(1..=MAX_PLAN_GROUPS)?;
        let groups: Vec<GroupKind> = (0..n)
            .map(|_| {
                Ok(if u.arbitrary::<bool>()? {
                    GroupKind::Mamba
                } else {
                    GroupKind::Attention
                })
            })
            .collect::<Result<_>>()?;
        let num_regions = u.int_in_range(1..=MAX_PLAN_REGIONS)?;
        let state_lists = if groups.contains(&GroupKind::Mamba) {
            u.int_in_range(1..=MAX_PLAN_STATE_LISTS)?
        } else {
            0
        };
        let push = u.arbitrary::<bool>()?;
        let ratio = u.int_in_range(1..=MAX_PLAN_RATIO)?;
        // Push handles decode pages larger than prefill's as sub-pages; only
        // one of the two relations applies.
        let sub_pages = if push && ratio == 1 {
            u.int_in_range(1..=MAX_PLAN_RATIO)?
        } else {
            1
        };
        let local = draw_side(u, n)?;
        let remote = draw_side(u, n)?;
        let prefix_skip = u.int_in_range(0..=MAX_PLAN_POOL * MAX_PLAN_PPL)?;
        Ok(PlanInput {
            local,
            remote,
            groups,
            num_regions,
            state_lists,
            ratio,
            sub_pages,
            push,
            prefix_skip,
        })
    }
}

impl fmt::Debug for PlanInput {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PlanInput")
            .field("mode", &if self.push { "push" } else { "pull" })
            .field("groups", &self.groups)
            .field("num_regions", &self.num_regions)
            .field("state_lists", &self.state_lists)
            .field("ratio", &self.ratio)
            .field("sub_pages", &self.sub_pages)
            .field("prefix_skip", &self.prefix_skip)
            .field("local", &self.local)
            .field("remote", &self.remote)
            .finish()
    }
}

impl PlanInput {
    /// The input drawn from `bytes`, as cargo-fuzz draws it.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        Self::arbitrary_take_rest(Unstructured::new(bytes))
    }

    /// Rows of the local list: attention sub-blocks of every region, then
    /// one row per logical block of every mamba list.
    pub fn local_list_len(&self) -> u64 {
        self.num_regions * self.local.kernel_blocks() * u64::from(self.ratio)
            + self.state_lists * u64::from(self.local.pool)
    }

    /// Rows of the remote list (its pages split into `sub_pages` in push).
    pub fn remote_list_len(&self) -> u64 {
        self.num_regions * self.remote.kernel_blocks() * u64::from(self.sub_pages)
            + self.state_lists * u64::from(self.remote.pool)
    }

    /// Both sides as the planner sees them.
    pub fn geometry(&self) -> TransferGeometry {
        let side = |s: &PlanSide| ListGeometry {
            num_kernel_blocks: s.kernel_blocks(),
            ppl: s.ppl,
        };
        TransferGeometry {
            groups: self.groups.clone(),
            num_regions: self.num_regions,
            num_state_lists: self.state_lists,
            initiator: side(&self.local),
            peer: side(&self.remote),
            ratio: self.ratio,
            peer_sub_pages: self.sub_pages,
            mode: if self.push { Mode::Push } else { Mode::Pull },
        }
    }

    /// Plan the request with the connector's planner under `policy`.
    /// `None`: nothing to transfer, or the planner refused the request
    /// (both fine); `Some(ids)`: the transfer.
    pub fn plan(&self, policy: &Policy) -> Option<TransferIds> {
        let skip = vec![self.prefix_skip as usize; self.groups.len()];
        let blocks = TransferBlocks {
            initiator: &self.local.block_ids,
            peer: &self.remote.block_ids,
            prefix_skip: &skip,
            peer_sub_blocks: None,
        };
        match plan_transfer(&self.geometry(), blocks, policy).ok()? {
            PlannedTransfer::Transfer(ids) => Some(ids),
            PlannedTransfer::NotifyOnly { .. } => None,
        }
    }

    /// The request's attention entries of one side in token order, in
    /// units of the smaller kernel: logical blocks expanded with the side's
    /// own ppl, then split into `split` sub-blocks.
    fn units(&self, side: &PlanSide, split: u32) -> BlockIds {
        logical_to_kernel(&side.block_ids, &self.groups, side.ppl)
            .into_iter()
            .map(|ids| {
                ids.into_iter()
                    .flat_map(|k| (0..split).map(move |q| k * split + q))
                    .collect()
            })
            .collect()
    }

    /// Plan under `policy` and check the transfer: every id addresses a row
    /// of its list, and every attention pair moves the same token.
    pub fn check(&self, policy: &Policy) -> std::result::Result<(), PlanFinding> {
        let Some(ids) = self.plan(policy) else {
            return Ok(());
        };
        for (side, list, len) in [
            ("local", &ids.local_desc_ids, self.local_list_len()),
            ("remote", &ids.remote_desc_ids, self.remote_list_len()),
        ] {
            if let Some((i, id)) = list
                .iter()
                .enumerate()
                .find(|(_, &id)| u64::from(id) >= len)
            {
                return Err(PlanFinding(format!(
                    "{side} desc id {id} at position {i} is outside the {side} list of {len} rows"
                )));
            }
        }
        self.check_token_alignment(&ids)
    }

    /// Decode's entries start at its prefix hit, prefill's at token 0: the
    /// k-th pair must name the same token unit on both sides.
    fn check_token_alignment(&self, ids: &TransferIds) -> std::result::Result<(), PlanFinding> {
        let local_units = self.units(&self.local, self.ratio);
        let remote_units = self.units(&self.remote, self.sub_pages);
        let skip = self.prefix_skip as usize;
        let (local_offset, remote_offset) = if self.push { (0, skip) } else { (skip, 0) };
        for (g, kind) in self.groups.iter().enumerate() {
            if *kind != GroupKind::Attention {
                continue;
            }
            let (Some(l), Some(r)) = (ids.local_block_ids.get(g), ids.remote_block_ids.get(g))
            else {
                continue;
            };
            let token = |units: &[u32], id: u32, offset: usize| {
                units.iter().position(|&u| u == id).map(|i| i + offset)
            };
            for (k, (&lid, &rid)) in l.iter().zip(r).enumerate() {
                let local_token = token(&local_units[g], lid, local_offset);
                let remote_token = token(&remote_units[g], rid, remote_offset);
                if local_token.is_none() || local_token != remote_token {
                    return Err(PlanFinding(format!(
                        "group {g} pair {k}: local entry {lid} holds token unit {local_token:?} \
                         but remote entry {rid} holds {remote_token:?}"
                    )));
                }
            }
        }
        Ok(())
    }
}
