//! The state part of `kvgeom explain --connector sglang` for a hybrid
//! geometry: per engine and rank, each state tensor kvgeom's model expects
//! SGLang to register (field and layer, channels on the slice axis, outer
//! rows, bytes per slot, the model channels it holds), the conv sub-blocks,
//! and the slot the request uses. The violations printed after it name the
//! tensor and the model channel (sub-block and index) that went wrong.

use std::fmt::Write;

use crate::geometry::sglang_state::StateKind;
use crate::sglang::batch::Prepared;
use crate::sglang::state::{Channel, Field, StatePools, StateTensor};

/// The state section, empty for a geometry without `[model.state]`.
pub(crate) fn state_text(p: &Prepared) -> String {
    let Some((prefill, decode)) = &p.state else {
        return String::new();
    };
    let mut out = String::new();
    let s = &prefill.state;
    let blocks = match prefill.sglang_conv_shard_groups() {
        Some(g) => format!(
            "{} {:?} (full channel counts, as SGLang's config names them from 0.5.16; a release naming none slices the conv row as one block)",
            sub_block_names(s.kind).join(" | "),
            g
        ),
        None => format!(
            "none ({} sliced as one block)",
            sub_block_names(s.kind).join(" | ")
        ),
    };
    let _ = writeln!(
        out,
        "\nstate ({}, layers {:?}): conv sub-blocks {blocks}",
        kind_name(s.kind),
        s.layers
    );
    for pools in [prefill, decode] {
        engine(&mut out, pools);
    }
    out
}

fn engine(out: &mut String, pools: &StatePools) {
    let _ = writeln!(
        out,
        "  {}: attention TP {}, {} state slots per tensor, the request's slot {}",
        pools.side, pools.attn_tp, pools.slots, pools.slot
    );
    for rank in 0..pools.attn_tp {
        for t in pools.tensors(rank) {
            let _ = writeln!(
                out,
                "    {}-{rank} [{}] {}: shape per slot [{}], slice axis {} ({} channels), outer count {}, {} B per slot; channels {}",
                pools.side,
                t.index,
                t.what(),
                shape(&t),
                slice_axis(&t),
                t.dim,
                t.outer,
                t.item_len(),
                channel_runs(&t.channels, pools.state.kind)
            );
        }
    }
}

/// The per-slot shape as (outer rows, channels, bytes per channel row).
fn shape(t: &StateTensor) -> String {
    if t.outer > 1 {
        format!("{}, {}, {} B", t.outer, t.dim, t.inner)
    } else {
        format!("{}, {} B", t.dim, t.inner)
    }
}

fn slice_axis(t: &StateTensor) -> &'static str {
    match (t.field, t.outer > 1) {
        (Field::Conv, true) => "1 (after the conv window)",
        _ => "0",
    }
}

fn kind_name(kind: StateKind) -> &'static str {
    match kind {
        StateKind::Mamba2 => "mamba2",
        StateKind::Gdn => "gdn",
        StateKind::Kda => "kda",
    }
}

fn sub_block_names(kind: StateKind) -> [&'static str; 3] {
    match kind {
        StateKind::Mamba2 => ["x", "B", "C"],
        _ => ["q", "k", "v"],
    }
}

fn block_name(block: u8, kind: StateKind) -> &'static str {
    if block == 0 {
        return "head";
    }
    sub_block_names(kind)[usize::from(block.min(3)) - 1]
}

/// The model channels as runs, e.g. `q 0..4, k 0..4, v 0..8`.
pub(crate) fn channel_runs(channels: &[Channel], kind: StateKind) -> String {
    let mut runs: Vec<(u8, u32, u32)> = Vec::new();
    for &(block, index) in channels {
        match runs.last_mut() {
            Some((b, _, end)) if *b == block && *end == index => *end = index + 1,
            _ => runs.push((block, index, index + 1)),
        }
    }
    runs.iter()
        .map(|(b, start, end)| format!("{} {start}..{end}", block_name(*b, kind)))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_split_at_sub_block_and_gap() {
        let ch = vec![(1, 0), (1, 1), (2, 4), (2, 5), (3, 0), (3, 2)];
        assert_eq!(
            channel_runs(&ch, StateKind::Gdn),
            "q 0..2, k 4..6, v 0..1, v 2..3"
        );
        assert_eq!(channel_runs(&[(0, 3)], StateKind::Mamba2), "head 3..4");
        assert_eq!(channel_runs(&[(2, 0)], StateKind::Mamba2), "B 0..1");
    }
}
