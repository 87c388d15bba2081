//! Every descriptor list one rank prepares for a geometry, as tables: the
//! view reviewers read in the layout snapshots and in `kvgeom layout`.

use std::fmt::Write;

use super::descriptor_table::{render, ListLabels};
use crate::connector::{ConnectorError, KvTensor, Worker, WorkerConfig};
use crate::geometry::{Geometry, Mode};
use crate::nixl::recording::Event;
use crate::nixl::{DlistTarget, DryRun, MemKind, Nixl, Recording};

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
                    mode,
                    is_decode: decode,
                    mem: MemKind::Dram,
                    platform_mem: MemKind::Dram,
                    device: 0,
                    defect: None,
                },
                &tensors,
            )
        })
        .collect()
}

/// The tables of rank 0 of the initiating engine (D in pull, P in push)
/// after its handshakes, or the handshake's refusal.
pub fn layout_tables(geometry: &Geometry, mode: Mode) -> String {
    let mut out = String::new();
    let mut nixl = Recording::new(DryRun::new());
    let built = (|| -> Result<(), ConnectorError> {
        let mut prefill = workers(&mut nixl, geometry, mode, false)?;
        let mut decode = workers(&mut nixl, geometry, mode, true)?;
        let (initiators, peers, peer_tp) = match mode {
            Mode::Pull => (&mut decode, &mut prefill, geometry.prefill.tp_size),
            Mode::Push => (&mut prefill, &mut decode, geometry.decode.tp_size),
        };
        let me = &mut initiators[0];
        for target in me.handshake_targets(peer_tp)? {
            let meta = peers[target as usize].metadata(&mut nixl)?;
            me.add_remote_agent(&mut nixl, &meta, target, peer_tp)?;
        }
        Ok(())
    })();
    let initiator = match mode {
        Mode::Pull => "decode-0",
        Mode::Push => "prefill-0",
    };
    let _ = writeln!(
        out,
        "geometry {} ({mode} mode, tables of {initiator})",
        geometry.name
    );
    let regs: Vec<(String, Vec<u64>)> = nixl
        .events()
        .iter()
        .filter_map(|e| match e {
            Event::RegisterMemory { agent, regions } => Some((
                nixl.name_of(*agent).unwrap_or("").to_string(),
                regions.iter().map(|r| r.addr).collect(),
            )),
            _ => None,
        })
        .collect();
    let bases_of = |name: &str| {
        regs.iter()
            .find(|(n, _)| n == name)
            .map(|(_, b)| b.clone())
            .unwrap_or_default()
    };
    let state_parts = geometry
        .model
        .mamba
        .as_ref()
        .map_or(0, |m| m.num_sub_regions());
    let mut index = 0;
    for e in nixl.events() {
        let Event::Dlist {
            agent,
            target,
            list,
            ..
        } = e
        else {
            continue;
        };
        if nixl.name_of(*agent) != Some(initiator) {
            continue;
        }
        let (title, bases) = match target {
            DlistTarget::Local => (format!("list #{index}: local"), bases_of(initiator)),
            DlistTarget::Remote(name) => (format!("list #{index}: remote {name}"), bases_of(name)),
        };
        // Attention rows: everything before the first mamba run.
        let attention_rows = if state_parts == 0 {
            list.len()
        } else {
            let state_runs = geometry.model.layer_slots as usize * state_parts;
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
        out.push_str(&render(&title, list, &labels));
        index += 1;
    }
    if let Err(e) = built {
        let _ = writeln!(out, "\nhandshake refused: {e}");
    }
    out
}
