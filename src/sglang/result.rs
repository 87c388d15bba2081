//! The driver's `result.json` of one case (`kvgeom-sglang-result/1`,
//! sglang-driver/README.md), read as far as kvgeom judges it, and the
//! posted transfers expanded to byte writes between KV regions.

use std::collections::BTreeMap;

use serde::Deserialize;

/// The format the driver writes.
pub const RESULT_FORMAT: &str = "kvgeom-sglang-result/1";

/// One case's result.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct DriverResult {
    /// `kvgeom-sglang-result/1`.
    #[serde(default)]
    pub format: String,
    /// `done`, `rejected`, `crashed`, `hung` or `error`.
    #[serde(default)]
    pub status: String,
    /// The rank or side the status concerns.
    #[serde(default)]
    pub side: Option<String>,
    /// SGLang's exception or the driver's reason.
    #[serde(default)]
    pub message: Option<String>,
    /// SGLang's version.
    #[serde(default)]
    pub sglang: Option<String>,
    /// torch's version.
    #[serde(default)]
    pub torch: Option<String>,
    /// Per agent (`prefill-0`, `decode-1`, ...).
    #[serde(default)]
    pub agents: BTreeMap<String, Agent>,
    /// Every prepared descriptor list.
    #[serde(default)]
    pub dlists: Vec<DescList>,
    /// Every transfer.
    #[serde(default)]
    pub xfers: Vec<Xfer>,
    /// Every descriptor NIXL (the stand-in) refused.
    #[serde(default)]
    pub refusals: Vec<Refusal>,
}

/// One rank's agent.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct Agent {
    /// `prefill` or `decode`.
    #[serde(default)]
    pub role: String,
    /// Its rank.
    #[serde(default)]
    pub rank: u32,
    /// Its KV regions in `kv_data_ptrs` order.
    #[serde(default)]
    pub regions: Vec<Region>,
    /// A hybrid model's state regions in `state_data_ptrs` order.
    #[serde(default)]
    pub state_regions: Vec<StateRegion>,
}

/// One state region (a conv or temporal tensor of one linear layer) as
/// SGLang registered it, with SGLang's slice metadata.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct StateRegion {
    /// Position in the state list.
    pub index: u32,
    /// `conv layer l` or `temporal layer l`.
    pub what: String,
    /// Its address in the driver's process.
    pub addr: u64,
    /// Bytes.
    pub len: u64,
    /// One slot.
    pub item_len: u64,
    /// `state_dim_per_tensor`.
    #[serde(default)]
    pub dim: u32,
    /// `state_slice_outer_counts`.
    #[serde(default)]
    pub outer_count: u32,
    /// `state_conv_shard_groups`.
    #[serde(default)]
    pub conv_shard_groups: Option<Vec<u32>>,
}

/// One KV region as SGLang registered it.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
pub struct Region {
    /// Position in `kv_data_ptrs`.
    pub index: u32,
    /// `K layer l`, `V layer l` or `layer l`.
    pub what: String,
    /// Its address in the driver's process.
    pub addr: u64,
    /// Bytes.
    pub len: u64,
    /// One page.
    pub item_len: u64,
}

/// One prepared list.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct DescList {
    /// The agent that prepared it.
    pub agent: String,
    /// Its handle (unique in the case).
    pub handle: u64,
    /// `local` or the peer agent whose memory it describes.
    pub target: String,
    /// Rows as SGLang passed them: `[addr, len, dev, stride, count]` runs
    /// or `[addr, len, dev]`.
    #[serde(default)]
    pub rows: Vec<Vec<u64>>,
}

/// One transfer.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct Xfer {
    /// The initiating agent.
    pub agent: String,
    /// `WRITE` or `READ`.
    pub op: String,
    /// The local list's handle.
    pub local: u64,
    /// The remote list's handle.
    pub remote: u64,
    /// The peer agent.
    pub peer: String,
    /// Desc ids of the local list.
    #[serde(default)]
    pub local_ids: Vec<u64>,
    /// Desc ids of the remote list, paired with `local_ids`.
    #[serde(default)]
    pub remote_ids: Vec<u64>,
    /// Whether it was posted.
    #[serde(default)]
    pub posted: bool,
}

/// One refused descriptor.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct Refusal {
    /// The agent that asked.
    #[serde(default)]
    pub agent: String,
    /// NIXL's reason (`NIXL_ERR_NOT_FOUND: ...`).
    #[serde(default)]
    pub reason: String,
    /// Who called: `sglang` = the innermost SGLang frame.
    #[serde(default)]
    pub caller: serde_json::Value,
}

impl Refusal {
    /// The SGLang function that asked NIXL, when known.
    pub fn function(&self) -> Option<&str> {
        self.caller.get("sglang")?.get("function")?.as_str()
    }
}

/// A byte position in a KV region of one rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Place {
    /// The rank.
    pub rank: u32,
    /// The region's index.
    pub region: u32,
    /// Bytes from the region's start.
    pub offset: u64,
}

/// One posted descriptor pair between KV regions: `len` bytes from a
/// prefill place to a decode place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Write {
    /// The transfer, in the driver's order.
    pub xfer: usize,
    /// The pair inside it.
    pub pair: usize,
    /// Prefill's bytes.
    pub source: Place,
    /// Decode's bytes.
    pub destination: Place,
    /// Bytes.
    pub len: u64,
}

/// The `i`-th block of a list: its address and length.
pub(crate) fn block(list: &DescList, mut i: u64) -> Option<(u64, u64)> {
    for row in &list.rows {
        match row.as_slice() {
            [addr, len, _dev, stride, count] => {
                if i < *count {
                    return Some((addr.checked_add(i.checked_mul(*stride)?)?, *len));
                }
                i -= count;
            }
            [addr, len, _dev] => {
                if i == 0 {
                    return Some((*addr, *len));
                }
                i -= 1;
            }
            _ => return None,
        }
    }
    None
}

/// The KV place of `[addr, addr + len)` in `agent`'s regions.
fn place(result: &DriverResult, agent: &str, addr: u64, len: u64) -> Option<(String, Place)> {
    let a = result.agents.get(agent)?;
    let r = a
        .regions
        .iter()
        .find(|r| addr >= r.addr && addr.saturating_add(len) <= r.addr.saturating_add(r.len))?;
    Some((
        a.role.clone(),
        Place {
            rank: a.rank,
            region: r.index,
            offset: addr - r.addr,
        },
    ))
}

impl DriverResult {
    /// Every posted pair between a prefill KV region and a decode KV
    /// region (the aux rows, in DRAM, are left out), and how many posted
    /// pairs could not be resolved to KV regions of both sides.
    pub fn kv_writes(&self) -> (Vec<Write>, usize) {
        let lists: BTreeMap<u64, &DescList> = self.dlists.iter().map(|l| (l.handle, l)).collect();
        let mut out = Vec::new();
        let mut unresolved = 0;
        for (x, xfer) in self.xfers.iter().enumerate() {
            if !xfer.posted {
                continue;
            }
            let (Some(local), Some(remote)) = (lists.get(&xfer.local), lists.get(&xfer.remote))
            else {
                unresolved += xfer.local_ids.len();
                continue;
            };
            for (pair, (&l, &r)) in xfer.local_ids.iter().zip(&xfer.remote_ids).enumerate() {
                let ends = block(local, l).zip(block(remote, r));
                let Some(((la, ll), (ra, rl))) = ends else {
                    unresolved += 1;
                    continue;
                };
                let here = place(self, &xfer.agent, la, ll);
                let there = place(self, &xfer.peer, ra, rl);
                let (src, dst) = if xfer.op == "READ" {
                    (there, here)
                } else {
                    (here, there)
                };
                match (src, dst) {
                    (Some((sr, s)), Some((dr, d))) if sr == "prefill" && dr == "decode" => out
                        .push(Write {
                            xfer: x,
                            pair,
                            source: s,
                            destination: d,
                            len: ll.min(rl),
                        }),
                    // Aux rows (DRAM, not a KV region) are not judged.
                    (None, None) => {}
                    _ => unresolved += 1,
                }
            }
        }
        (out, unresolved)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strided_runs_expand_block_by_block_and_plain_rows_follow() {
        let list = DescList {
            agent: "prefill-0".into(),
            handle: 1,
            target: "local".into(),
            rows: vec![vec![1000, 16, 0, 32, 3], vec![5000, 8, 0]],
        };
        assert_eq!(block(&list, 0), Some((1000, 16)));
        assert_eq!(block(&list, 2), Some((1064, 16)));
        assert_eq!(block(&list, 3), Some((5000, 8)));
        assert_eq!(block(&list, 4), None);
    }
}
