//! [`PlanInput`]: arbitrary block-id lists for the request planner
//! (`connector/block_mapping.rs` and `connector/desc_ids.rs`), composed as
//! pull and push compose them, with a check that every descriptor id lies
//! inside the list it addresses.

use std::fmt;

use arbitrary::{Arbitrary, Result, Unstructured};

use crate::connector::block_mapping::{
    apply_prefix_caching, logical_to_kernel, map_for_block_size_ratio, BlockIds,
};
use crate::connector::desc_ids::{compute_desc_ids, ListShape};
use crate::geometry::GroupKind;

/// KV-cache groups of the model.
pub const MAX_PLAN_GROUPS: usize = 4;
/// Regions (layer slots) of each list.
pub const MAX_PLAN_REGIONS: u64 = 4;
/// Logical blocks in each side's pool.
pub const MAX_PLAN_POOL: u32 = 24;
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
    pub groups: Vec<GroupKind>,
    pub num_regions: u64,
    /// Mamba descriptor lists per side; 0 without a mamba group.
    pub state_lists: u64,
    /// The initiator's side: decode in pull, prefill in push.
    pub local: PlanSide,
    pub remote: PlanSide,
    /// Push writes into decode pages: local kernel / remote kernel (>= 1).
    /// Pull reads: the same ratio, decode's kernel over prefill's.
    pub ratio: u32,
    /// Push only: remote (decode) pages seen as this many local-sized sub-pages.
    pub sub_pages: u32,
    pub push: bool,
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
    let block_ids = (0..groups)
        .map(|_| {
            let n = u.int_in_range(0..=pool)?;
            (0..n).map(|_| u.int_in_range(0..=pool - 1)).collect()
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
        Ok(PlanInput {
            local: draw_side(u, n)?,
            remote: draw_side(u, n)?,
            groups,
            num_regions,
            state_lists,
            ratio,
            sub_pages,
            push,
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
            .field("local", &self.local)
            .field("remote", &self.remote)
            .finish()
    }
}

/// The planned descriptor ids of one transfer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedIds {
    pub local: Vec<u32>,
    pub remote: Vec<u32>,
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

    /// Plan the request as the connector does. `Ok(None)`: nothing to
    /// transfer, or the planner refused the request with an error (both
    /// fine); `Ok(Some(ids))`: the descriptor ids of the transfer.
    pub fn plan(&self) -> Option<PlannedIds> {
        let groups = &self.groups;
        let mut local = logical_to_kernel(&self.local.block_ids, groups, self.local.ppl);
        let mut remote = logical_to_kernel(&self.remote.block_ids, groups, self.remote.ppl);
        let sub = self.sub_pages;
        if sub > 1 {
            for (ids, kind) in remote.iter_mut().zip(groups) {
                if *kind == GroupKind::Attention {
                    *ids = ids
                        .iter()
                        .flat_map(|&k| (0..sub).map(move |q| k * sub + q))
                        .collect();
                }
            }
        }
        if self.ratio > 1 && self.push {
            // Push expands prefill's larger pages without clipping them.
            let ratio = self.ratio;
            for (ids, kind) in local.iter_mut().zip(groups) {
                if *kind == GroupKind::Attention {
                    *ids = ids
                        .iter()
                        .flat_map(|&k| (0..ratio).map(move |q| k * ratio + q))
                        .collect();
                }
            }
        } else if self.ratio > 1 {
            (local, remote) = map_for_block_size_ratio(&local, &remote, groups, self.ratio);
        }
        if sub > 1 {
            for ((r, l), kind) in remote.iter_mut().zip(&local).zip(groups) {
                if *kind == GroupKind::Attention {
                    r.truncate(l.len());
                }
            }
        }
        if local.iter().all(Vec::is_empty) {
            return None;
        }
        let (local, remote) = if self.push {
            let (r, l) = apply_prefix_caching(
                &remote,
                &local,
                groups,
                self.remote.ppl * sub,
                self.local.ppl,
                Default::default(),
            )
            .ok()?;
            (l, r)
        } else {
            apply_prefix_caching(
                &local,
                &remote,
                groups,
                self.local.ppl,
                self.remote.ppl,
                Default::default(),
            )
            .ok()?
        };
        let shape = |side: &PlanSide, ratio: Option<u32>| ListShape {
            num_regions: self.num_regions,
            num_kernel_blocks: side.kernel_blocks(),
            ratio,
            ppl: side.ppl,
            num_state_lists: self.state_lists,
        };
        let remote_ratio = (sub > 1).then_some(sub);
        Some(PlannedIds {
            local: compute_desc_ids(
                &local,
                groups,
                shape(&self.local, Some(self.ratio)),
                Default::default(),
            ),
            remote: compute_desc_ids(
                &remote,
                groups,
                shape(&self.remote, remote_ratio),
                Default::default(),
            ),
        })
    }

    /// Plan and check that every id addresses a row of its list.
    pub fn check(&self) -> std::result::Result<(), PlanFinding> {
        let Some(ids) = self.plan() else {
            return Ok(());
        };
        for (side, list, len) in [
            ("local", &ids.local, self.local_list_len()),
            ("remote", &ids.remote, self.remote_list_len()),
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
        Ok(())
    }
}
