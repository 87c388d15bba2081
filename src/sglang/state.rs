//! Hybrid models' linear-attention state (Mamba2 / GDN / KDA) in SGLang's
//! `MambaPool`: kvgeom's own model of the state tensors of each rank
//! (written from the geometry's `[model.state]`, not from SGLang's code),
//! the bytes it prepares, and the state oracles.
//!
//! Per linear layer a rank holds one conv tensor and one temporal (SSM)
//! tensor, each `[slots, ...]`, one slot per request (the pool's `size + 1`
//! slots). Entries are every layer's conv, then every layer's temporal.
//!
//! - conv, Mamba2 / GDN: `[conv_dim / tp, K - 1]`, sliced on its first
//!   axis; a rank's rows are its shard of each sub-block in turn (Mamba2
//!   `x | B | C`, with B and C's groups replicated where TP exceeds
//!   `n_groups`; GDN `q | k | v`);
//! - conv, KDA: `[K - 1, (q + k + v) / tp]`, sliced on its second axis
//!   (`K - 1` outer rows);
//! - temporal: `[heads / tp, head_dim, state]` (GDN: value heads, `head_v_dim`,
//!   `head_k_dim`; KDA: `head_dim` twice), sliced on heads.
//!
//! A state byte's identity is (conv or temporal, layer, model channel,
//! byte inside the channel's outer rows x inner bytes); the model channel
//! is global across TP (replicas share it). The oracles:
//!
//! - `pairing`: every posted pair between state regions moves prefill's
//!   byte of the request's slot to decode's byte of the request's slot with
//!   the same identity (a conv state sliced as one block across sub-blocks
//!   breaks it);
//! - `transferred_or_zeroed` (and `coverage` for bytes left untouched):
//!   decode's slot holds, per byte, prefill's byte of the same identity;
//! - `neighbour_preservation`: decode's other slots are untouched and
//!   prefill's state memory is unchanged.

use crate::geometry::sglang_state::{SglangState, StateKind};
use crate::layout::Side;
use crate::oracle::Violation;
use crate::pattern::SENTINEL;

use super::error::JudgeError;
use super::result::DriverResult;

/// Conv or temporal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Field {
    /// The causal conv's window.
    Conv,
    /// The SSM / recurrent state.
    Temporal,
}

impl Field {
    fn name(self) -> &'static str {
        match self {
            Field::Conv => "conv",
            Field::Temporal => "temporal",
        }
    }
}

/// A model channel along a tensor's slice axis: (sub-block, index in it).
/// Sub-blocks: 0 heads (temporal), 1..=3 x|B|C or q|k|v.
pub type Channel = (u8, u32);

/// One state tensor of one rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateTensor {
    /// Position in SGLang's state list.
    pub index: u32,
    /// Conv or temporal.
    pub field: Field,
    /// The model layer.
    pub layer: u32,
    /// Slots of the pool.
    pub slots: u32,
    /// Rows before the slice axis (KDA conv: `K - 1`).
    pub outer: u32,
    /// Channels along the slice axis on this rank.
    pub dim: u32,
    /// Bytes after the slice axis per channel.
    pub inner: u64,
    /// The model channel of each local channel.
    pub channels: Vec<Channel>,
}

impl StateTensor {
    /// One slot.
    pub fn item_len(&self) -> u64 {
        u64::from(self.outer) * u64::from(self.dim) * self.inner
    }
    /// The whole tensor.
    pub fn len(&self) -> u64 {
        self.item_len() * u64::from(self.slots)
    }
    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// As the driver names it.
    pub fn what(&self) -> String {
        format!("{} layer {}", self.field.name(), self.layer)
    }
    /// The identity of byte `offset`: (slot, channel, byte in the channel).
    pub fn locate(&self, offset: u64) -> Option<(u32, Channel, u64)> {
        if offset >= self.len() || self.item_len() == 0 {
            return None;
        }
        let slot = (offset / self.item_len()) as u32;
        let w = offset % self.item_len();
        let row = u64::from(self.dim) * self.inner;
        let (o, rest) = (w / row, w % row);
        let c = (rest / self.inner) as usize;
        Some((
            slot,
            *self.channels.get(c)?,
            o * self.inner + rest % self.inner,
        ))
    }
}

/// The state pools of one engine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatePools {
    /// Which engine.
    pub side: Side,
    /// The model's state.
    pub state: SglangState,
    /// Attention TP.
    pub attn_tp: u32,
    /// Slots per tensor (the driver's `state_slots` + 1).
    pub slots: u32,
    /// The request's slot.
    pub slot: u32,
}

/// Bytes of a conv element (bfloat16) and of a temporal one (float32), as
/// SGLang's default state dtype.
pub const CONV_BYTES: u64 = 2;
/// See [`CONV_BYTES`].
pub const TEMPORAL_BYTES: u64 = 4;
/// The driver's pool size (`state_slots`); SGLang adds one slot.
pub const STATE_SLOTS: u32 = 4;

fn shard(block: u8, full: u32, tp: u32, rank: u32) -> Vec<Channel> {
    let n = full / tp;
    (0..n).map(|j| (block, rank * n + j)).collect()
}

impl StatePools {
    /// The engine's state pools, the request in `slot`.
    pub fn new(side: Side, state: &SglangState, attn_tp: u32, slot: u32) -> Self {
        StatePools {
            side,
            state: state.clone(),
            attn_tp,
            slots: STATE_SLOTS + 1,
            slot,
        }
    }

    /// The model conv channels of `rank`, in its conv row's order.
    pub fn conv_channels(&self, rank: u32) -> Vec<Channel> {
        let s = &self.state;
        let tp = self.attn_tp;
        let g = |v: Option<u32>| v.unwrap_or(0);
        match s.kind {
            StateKind::Mamba2 => {
                let (ng, n) = (g(s.n_groups), g(s.ssm_state_size));
                let mut out = shard(1, g(s.num_heads) * g(s.head_dim), tp, rank);
                for block in [2u8, 3] {
                    if ng % tp == 0 {
                        out.extend(shard(block, ng * n, tp, rank));
                    } else {
                        // One group per rank, replicated: rank r's heads' group.
                        let grp = rank * ng / tp;
                        out.extend((0..n).map(|j| (block, grp * n + j)));
                    }
                }
                out
            }
            StateKind::Gdn => {
                let k = g(s.num_k_heads) * g(s.head_k_dim);
                let mut out = shard(1, k, tp, rank);
                out.extend(shard(2, k, tp, rank));
                out.extend(shard(3, g(s.num_v_heads) * g(s.head_v_dim), tp, rank));
                out
            }
            StateKind::Kda => {
                let q = g(s.num_heads) * g(s.head_dim);
                let k =
                    s.num_k_heads.unwrap_or(g(s.num_heads)) * s.head_k_dim.unwrap_or(g(s.head_dim));
                let mut out = shard(1, q, tp, rank);
                out.extend(shard(2, k, tp, rank));
                out.extend(shard(3, k, tp, rank));
                out
            }
        }
    }

    /// The conv sub-blocks SGLang's config for this kind names
    /// (`state_conv_shard_groups` of a conv tensor): none for Mamba2.
    pub fn sglang_conv_shard_groups(&self) -> Option<Vec<u32>> {
        let s = &self.state;
        let g = |v: Option<u32>| v.unwrap_or(0);
        match s.kind {
            StateKind::Mamba2 => None,
            StateKind::Gdn => {
                let k = g(s.num_k_heads) * g(s.head_k_dim);
                Some(vec![k, k, g(s.num_v_heads) * g(s.head_v_dim)])
            }
            StateKind::Kda => {
                let q = g(s.num_heads) * g(s.head_dim);
                let k =
                    s.num_k_heads.unwrap_or(g(s.num_heads)) * s.head_k_dim.unwrap_or(g(s.head_dim));
                Some(vec![q, k, k])
            }
        }
    }

    /// Every state tensor of `rank`, in SGLang's order.
    pub fn tensors(&self, rank: u32) -> Vec<StateTensor> {
        let s = &self.state;
        let g = |v: Option<u32>| v.unwrap_or(0);
        let window = s.conv_kernel - 1;
        let conv = self.conv_channels(rank);
        let (heads, hd, st) = match s.kind {
            StateKind::Mamba2 => (g(s.num_heads), g(s.head_dim), g(s.ssm_state_size)),
            StateKind::Gdn => (g(s.num_v_heads), g(s.head_v_dim), g(s.head_k_dim)),
            StateKind::Kda => (g(s.num_heads), g(s.head_dim), g(s.head_dim)),
        };
        let temporal = shard(0, heads, self.attn_tp, rank);
        let kda = s.kind == StateKind::Kda;
        // Every layer's conv tensor, then every layer's temporal one:
        // (field, outer, inner bytes, channels).
        let kinds = [
            (
                Field::Conv,
                if kda { window } else { 1 },
                if kda {
                    CONV_BYTES
                } else {
                    u64::from(window) * CONV_BYTES
                },
                conv,
            ),
            (
                Field::Temporal,
                1,
                u64::from(hd) * u64::from(st) * TEMPORAL_BYTES,
                temporal,
            ),
        ];
        let mut out = Vec::new();
        for (field, outer, inner, channels) in kinds {
            for &layer in &s.layers {
                out.push(StateTensor {
                    index: out.len() as u32,
                    field,
                    layer,
                    slots: self.slots,
                    outer,
                    dim: channels.len() as u32,
                    inner,
                    channels: channels.clone(),
                });
            }
        }
        out
    }
}

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Prefill's byte of a state identity in `slot`: never [`SENTINEL`].
pub fn state_byte(field: Field, layer: u32, ch: Channel, slot: u32, byte: u64) -> u8 {
    let f = u64::from(field == Field::Conv);
    let key = f
        ^ u64::from(layer) << 1
        ^ u64::from(ch.0) << 9
        ^ u64::from(ch.1) << 12
        ^ u64::from(slot) << 36
        ^ byte << 44;
    let b = (mix(key ^ 0x5eed) & 0xff) as u8;
    if b == SENTINEL {
        0x55
    } else {
        b
    }
}

/// Prefill's initial image of one state tensor.
pub fn prefill_image(t: &StateTensor) -> Vec<u8> {
    (0..t.len())
        .map(|off| match t.locate(off) {
            Some((slot, ch, b)) => state_byte(t.field, t.layer, ch, slot, b),
            None => SENTINEL,
        })
        .collect()
}

/// Every state image of an engine, `[rank][tensor]`.
pub type StateImages = Vec<Vec<Vec<u8>>>;

/// Compare the driver's `state_regions` of every rank with kvgeom's model:
/// how many ranks agreed, or the first disagreement.
pub fn check_state_layout(pools: &StatePools, r: &DriverResult) -> Result<u32, JudgeError> {
    let mut checked = 0;
    for rank in 0..pools.attn_tp {
        let agent = format!("{}-{rank}", pools.side);
        let Some(a) = r.agents.get(&agent) else {
            continue;
        };
        if a.regions.is_empty() {
            continue;
        }
        let model = pools.tensors(rank);
        let found = &a.state_regions;
        if found.len() != model.len() {
            return Err(JudgeError::StateCount {
                agent,
                found: found.len(),
                model: model.len(),
            });
        }
        for (m, f) in model.iter().zip(found) {
            // A release whose config names no conv sub-blocks (GDN before
            // 0.5.16) reports none: its conv row is then sliced as one block,
            // which the oracles judge byte by byte, not this layout check.
            let csg = if m.field == Field::Conv && f.conv_shard_groups.is_some() {
                pools.sglang_conv_shard_groups()
            } else {
                None
            };
            let mine = (m.what(), m.len(), m.item_len(), m.dim, m.outer, csg);
            let theirs = (
                f.what.clone(),
                f.len,
                f.item_len,
                f.dim,
                f.outer_count,
                f.conv_shard_groups.clone(),
            );
            if mine != theirs {
                return Err(JudgeError::StateRegion {
                    agent,
                    index: m.index,
                    theirs: format!("{theirs:?}"),
                    mine: format!("{mine:?}"),
                });
            }
        }
        checked += 1;
    }
    Ok(checked)
}

/// A posted pair between a prefill state region and a decode one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateWrite {
    /// Prefill rank, tensor, offset.
    pub source: (u32, u32, u64),
    /// Decode rank, tensor, offset.
    pub destination: (u32, u32, u64),
    /// Bytes.
    pub len: u64,
}

fn state_place(
    r: &DriverResult,
    agent: &str,
    addr: u64,
    len: u64,
) -> Option<(bool, u32, u32, u64)> {
    let a = r.agents.get(agent)?;
    let s = a
        .state_regions
        .iter()
        .find(|s| addr >= s.addr && addr.saturating_add(len) <= s.addr.saturating_add(s.len))?;
    Some((a.role == "prefill", a.rank, s.index, addr - s.addr))
}

/// Every posted pair from a prefill state region to a decode state region,
/// in the order of the decode bytes they write.
pub fn state_writes(r: &DriverResult) -> Vec<StateWrite> {
    let lists: std::collections::BTreeMap<u64, &super::result::DescList> =
        r.dlists.iter().map(|l| (l.handle, l)).collect();
    let mut out = Vec::new();
    for x in r.xfers.iter().filter(|x| x.posted) {
        let (Some(local), Some(remote)) = (lists.get(&x.local), lists.get(&x.remote)) else {
            continue;
        };
        for (&l, &rm) in x.local_ids.iter().zip(&x.remote_ids) {
            let (Some((la, ll)), Some((ra, rl))) = (
                super::result::block(local, l),
                super::result::block(remote, rm),
            ) else {
                continue;
            };
            let here = state_place(r, &x.agent, la, ll);
            let there = state_place(r, &x.peer, ra, rl);
            let (src, dst) = if x.op == "READ" {
                (there, here)
            } else {
                (here, there)
            };
            if let (Some((true, sr, si, so)), Some((false, dr, di, dof))) = (src, dst) {
                out.push(StateWrite {
                    source: (sr, si, so),
                    destination: (dr, di, dof),
                    len: ll.min(rl),
                });
            }
        }
    }
    // SGLang's transfer threads post in whatever order they run: judged in
    // the order of the bytes they write, a report names the same pair on
    // every run.
    out.sort_by_key(|w| (w.destination, w.source, w.len));
    out
}

/// What the state oracles read.
pub struct StateObserved<'a> {
    /// Prefill's state pools.
    pub prefill: &'a StatePools,
    /// Decode's state pools.
    pub decode: &'a StatePools,
    /// Prefill's state memory before the run (`[rank][tensor]`).
    pub prefill_before: &'a StateImages,
    /// And after.
    pub prefill_after: &'a StateImages,
    /// Decode's after (it started as SENTINEL).
    pub decode_after: &'a StateImages,
    /// Posted pairs between state regions.
    pub writes: &'a [StateWrite],
}

struct Tally {
    oracle: &'static str,
    side: Side,
    rank: u32,
    region: u32,
    first: u64,
    last: u64,
    count: u64,
    what: String,
    expected: String,
    found: String,
}

fn tally(
    out: &mut Vec<Tally>,
    key: (&'static str, Side, u32, u32),
    off: u64,
    what: impl FnOnce() -> (String, String, String),
) {
    if let Some(t) = out
        .iter_mut()
        .find(|t| (t.oracle, t.side, t.rank, t.region) == key)
    {
        t.first = t.first.min(off);
        t.last = t.last.max(off);
        t.count += 1;
        return;
    }
    let (what, expected, found) = what();
    out.push(Tally {
        oracle: key.0,
        side: key.1,
        rank: key.2,
        region: key.3,
        first: off,
        last: off,
        count: 1,
        what,
        expected,
        found,
    });
}

fn chan(c: Channel, kind: StateKind) -> String {
    let names: [&str; 4] = match kind {
        StateKind::Mamba2 => ["head", "x", "B", "C"],
        _ => ["head", "q", "k", "v"],
    };
    format!("{} {}", names[usize::from(c.0.min(3))], c.1)
}

/// Run the state oracles. Region numbers in the violations are the state
/// tensor's index plus `region_base` (after the KV regions).
pub fn judge_state(o: &StateObserved, region_base: u32) -> Vec<Violation> {
    let mut t: Vec<Tally> = Vec::new();
    let kind = o.decode.state.kind;
    // pairing over every posted pair.
    for w in o.writes {
        let (sr, si, so) = w.source;
        let (dr, di, dof) = w.destination;
        let p_t = o.prefill.tensors(sr);
        let d_t = o.decode.tensors(dr);
        let (Some(pt), Some(dt)) = (p_t.get(si as usize), d_t.get(di as usize)) else {
            continue;
        };
        for k in 0..w.len {
            let a = pt.locate(so + k);
            let b = dt.locate(dof + k);
            let ok = match (a, b) {
                (Some((ps, pc, pb)), Some((ds, dc, db))) => {
                    pt.field == dt.field
                        && pt.layer == dt.layer
                        && pc == dc
                        && pb == db
                        && ps == o.prefill.slot
                        && ds == o.decode.slot
                }
                _ => false,
            };
            if !ok {
                tally(
                    &mut t,
                    ("pairing", Side::Decode, dr, region_base + di),
                    dof + k,
                    || {
                        let show = |x: Option<(u32, Channel, u64)>, tt: &StateTensor| match x {
                            Some((s, c, b)) => {
                                format!("{} slot {s} {} byte {b}", tt.what(), chan(c, kind))
                            }
                            None => "outside the tensor".into(),
                        };
                        (
                        format!(
                            "a posted state pair moves prefill-{sr}'s byte to a decode byte of another state identity"
                        ),
                        show(b, dt),
                        format!("prefill-{sr} {}", show(a, pt)),
                    )
                    },
                );
            }
        }
    }
    // final bytes of decode.
    for dr in 0..o.decode.attn_tp {
        for dt in o.decode.tensors(dr) {
            let Some(img) = o
                .decode_after
                .get(dr as usize)
                .and_then(|r| r.get(dt.index as usize))
            else {
                continue;
            };
            for (off, &got) in img.iter().enumerate() {
                let off = off as u64;
                let Some((slot, ch, b)) = dt.locate(off) else {
                    continue;
                };
                let region = region_base + dt.index;
                if slot == o.decode.slot {
                    let want = state_byte(dt.field, dt.layer, ch, o.prefill.slot, b);
                    if got != want {
                        let oracle = if got == SENTINEL {
                            "coverage"
                        } else {
                            "transferred_or_zeroed"
                        };
                        tally(&mut t, (oracle, Side::Decode, dr, region), off, || {
                            (
                                format!(
                                    "decode's state slot does not hold prefill's byte of {} {}",
                                    dt.what(),
                                    chan(ch, kind)
                                ),
                                format!("{want:#04x}"),
                                format!("{got:#04x}"),
                            )
                        });
                    }
                } else if got != SENTINEL {
                    tally(
                        &mut t,
                        ("neighbour_preservation", Side::Decode, dr, region),
                        off,
                        || {
                            (
                                format!(
                                    "decode's state slot {slot} (not the request's) was written"
                                ),
                                format!("{SENTINEL:#04x}"),
                                format!("{got:#04x}"),
                            )
                        },
                    );
                }
            }
        }
    }
    for (rank, (before, after)) in o.prefill_before.iter().zip(o.prefill_after).enumerate() {
        for (i, (b, a)) in before.iter().zip(after).enumerate() {
            for (off, (x, y)) in b.iter().zip(a).enumerate() {
                if x != y {
                    tally(
                        &mut t,
                        (
                            "neighbour_preservation",
                            Side::Prefill,
                            rank as u32,
                            region_base + i as u32,
                        ),
                        off as u64,
                        || {
                            (
                                "prefill's state memory changed".into(),
                                format!("{x:#04x}"),
                                format!("{y:#04x}"),
                            )
                        },
                    );
                }
            }
        }
    }
    t.into_iter()
        .map(|g| {
            Violation::new(g.oracle, g.what)
                .on(Some(g.side), Some(g.rank))
                .region(Some(g.region))
                .bytes(g.first..g.last + 1, g.count)
                .expected(g.expected)
                .found(g.found)
        })
        .collect()
}

#[cfg(test)]
mod tests;
