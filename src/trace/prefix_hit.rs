//! Decode's prefix hit in a v1 trace: `request.local_num_computed_blocks`
//! counts, per KV-cache group, the logical blocks decode already holds. The
//! attention group's hit blocks come before the request's blocks and are not
//! in `local_block_ids`, and a v1 trace does not record their ids. The
//! reproducers' recorder gives decode's attention blocks the ids `2i+1`
//! (block `i` of the prompt); other recorders (kvgeom's live driver) place
//! them as their scheduler does. Hit block `i` is therefore `2i+1` unless the
//! request uses that id, in which case the lowest free id stands in for it:
//! the oracles only need, for each hit block, a block the request does not
//! hold and the transfer must not write, and no verdict depends on which.

use std::collections::BTreeSet;

use super::case::TraceCase;

impl TraceCase {
    /// Logical blocks of the attention group decode already holds (0 without
    /// a prefix hit).
    pub fn prefix_hit_blocks(&self) -> u32 {
        self.request
            .blocks
            .local_num_computed_blocks
            .first()
            .map_or(0, |&n| u32::try_from(n).unwrap_or(u32::MAX))
    }

    /// Decode's tokens already held: the hit blocks times decode's logical block.
    pub fn prefix_hit_tokens(&self) -> u32 {
        self.prefix_hit_blocks()
            .saturating_mul(self.worker.local_block_size)
    }

    /// Ids for the attention group's prefix-hit blocks, in prompt order.
    pub fn prefix_hit_ids(&self) -> Vec<u32> {
        let used: BTreeSet<u64> = self
            .request
            .blocks
            .local_block_ids
            .iter()
            .flatten()
            .copied()
            .collect();
        let mut taken = used.clone();
        let mut free =
            (0..u64::from(self.worker.num_logical_blocks)).filter(|id| !used.contains(id));
        let mut ids = Vec::new();
        for i in 0..u64::from(self.prefix_hit_blocks()) {
            let preferred = 2 * i + 1;
            let id = if preferred < u64::from(self.worker.num_logical_blocks)
                && taken.insert(preferred)
            {
                preferred
            } else {
                match free.by_ref().find(|id| taken.insert(*id)) {
                    Some(id) => id,
                    None => break,
                }
            };
            ids.push(u32::try_from(id).unwrap_or(u32::MAX));
        }
        ids
    }
}
