//! Every descriptor list one rank prepares for a geometry, as tables: the
//! view reviewers read in the layout snapshots and in `kvgeom layout`.

use std::fmt::Write;

use super::descriptor_table::{render, ListLabels};
use crate::connector::{ConnectorError, KvTensor, Policy, Role, Worker, WorkerConfig};
use crate::geometry::{Geometry, Mode};
use crate::nixl::{DryRun, MemKind, Nixl, Recording};

/// Logical blocks per pool when the geometry does not fix one.
pub const TABLE_POOL_BLOCKS: u32 = 4;

fn base(side: u64, rank: u64, region: u64) -> u64 {
    (1 + side * 64 + rank * 8 + region) << 32
}

fn workers(
    nixl: &mut dyn Nixl,
    geometry: &Geometry,
    mode: Mode,
    decode: bool,
    policy: Policy,
) -> Result<Vec<Worker>, ConnectorError> {
    let engine = if decode {
        &geometry.decode
    } else {
        &geometry.prefill
    };
    let pool = engine.num_logical_blocks.unwrap_or(TABLE_POOL_BLOCKS);
    let len = u64::from(pool) * engine.unified_page_bytes(&geometry.model);
    (0..engine.tp_size)
        .map(|rank| {
            let side = if decode { "decode" } else { "prefill" };
            let tensors: Vec<KvTensor> = (0..geometry.model.layer_slots)
                .map(|r| KvTensor {
                    base: base(u64::from(decode), u64::from(rank), u64::from(r)),
                    len,
                })
                .collect();
            Worker::register(
                nixl,
                WorkerConfig {
                    engine_id: side.into(),
                    agent_name: format!("{side}-{rank}"),
                    model: geometry.model.clone(),
                    engine: engine.clone(),
                    num_logical_blocks: pool,
                    tp_rank: rank,
                    role: Role::new(mode, decode),
                    mem: MemKind::Dram,
                    platform_mem: MemKind::Dram,
                    device: 0,
                    policy,
                    compat_factors: None,
                    enforce_compat: false,
                },
                &tensors,
            )
        })
        .collect()
}

/// The tables of rank 0 of the initiating engine (D in pull, P in push)
/// after its handshakes under `policy`, or the handshake's refusal.
pub fn layout_tables(geometry: &Geometry, mode: Mode, policy: Policy) -> String {
    let mut out = String::new();
    let mut nixl = Recording::new(DryRun::new());
    let initiator = match mode {
        Mode::Pull => "decode-0",
        Mode::Push => "prefill-0",
    };
    let _ = writeln!(
        out,
        "geometry {} ({mode} mode, lists of {initiator})",
        geometry.name
    );
    let mut engines = match (
        workers(&mut nixl, geometry, mode, false, policy),
        workers(&mut nixl, geometry, mode, true, policy),
    ) {
        (Ok(p), Ok(d)) => (p, d),
        (Err(e), _) | (_, Err(e)) => {
            let _ = writeln!(out, "\nregistration refused: {e}");
            return out;
        }
    };
    let (initiators, peers, peer_tp) = match mode {
        Mode::Pull => (&mut engines.1, &mut engines.0, geometry.prefill.tp_size),
        Mode::Push => (&mut engines.0, &mut engines.1, geometry.decode.tp_size),
    };
    let handshake = (|| -> Result<(), ConnectorError> {
        let me = &mut initiators[0];
        for target in me.handshake_targets(peer_tp)? {
            let meta = peers[target as usize].metadata(&mut nixl)?;
            me.add_remote_agent(&mut nixl, &meta, target, peer_tp)?;
        }
        Ok(())
    })();
    let me = &initiators[0];
    let state_parts = geometry
        .model
        .mamba
        .as_ref()
        .map_or(0, |m| m.num_sub_regions());
    let local_bases = me.registration().base_addresses();
    for (label, _, list) in me.prepared_lists() {
        let bases = if label.starts_with("remote") {
            let rank: usize = label
                .split_whitespace()
                .nth(3)
                .and_then(|r| r.parse().ok())
                .unwrap_or(0);
            peers[rank].registration().base_addresses()
        } else {
            local_bases.clone()
        };
        // Attention rows: everything before the mamba runs.
        let attention_rows = if state_parts == 0 {
            list.len()
        } else {
            let state_runs = geometry.model.state_slot_count() as usize * state_parts;
            let runs = list.runs();
            runs[..runs.len().saturating_sub(state_runs)]
                .iter()
                .map(|r| r.count)
                .sum()
        };
        let labels = ListLabels {
            region_bases: bases,
            attention_rows,
            state_parts,
        };
        out.push('\n');
        out.push_str(&render(&label, list, &labels));
    }
    if let Err(e) = handshake {
        let _ = writeln!(out, "\n{e}");
    }
    out
}
