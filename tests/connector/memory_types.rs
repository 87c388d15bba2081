//! The memory type of every list the connector prepares, by vLLM 0.33.0's
//! rule (`base_worker.py`, checked with its classes): on host tensors under
//! a platform that reports device memory, the own list and the list expanded
//! for a smaller remote kernel block take the regions' type; the per-source
//! split lists the platform's; a remote list the type the peer advertises
//! for its regions, else the platform's. A peer advertising mixed types is
//! refused, as vLLM's pull refuses a mixed-memory producer.

use kvgeom::connector::{HandshakeMetadata, KvTensor, Policy, Role, Worker, WorkerConfig};
use kvgeom::geometry::{EngineGeometry, Mode};
use kvgeom::internals::fixtures::mla_kda;
use kvgeom::nixl::{DlistTarget, DryRun, Event, MemKind, Recording};

/// The lists decode rank 0 (TP1, kernel 8, logical 16, host tensors, a
/// VRAM platform) prepares after handshaking with both ranks of a TP2
/// prefill engine (kernel 4, logical 8), whose advertised region types
/// `advertise` rewrites: `(target, type)` in order.
fn decode_lists(
    advertise: impl Fn(&mut HandshakeMetadata),
) -> Result<Vec<(DlistTarget, MemKind)>, String> {
    let model = mla_kda([2, 2, 4], 64);
    let mut nixl = Recording::new(DryRun::new());
    let cfg = |name: &str, engine: EngineGeometry, rank, is_decode: bool, mem| WorkerConfig {
        engine_id: if is_decode { "decode" } else { "prefill" }.into(),
        agent_name: name.into(),
        model: model.clone(),
        engine,
        num_logical_blocks: 8,
        tp_rank: rank,
        role: Role::new(Mode::Pull, is_decode),
        mem,
        platform_mem: MemKind::Vram,
        device: 0,
        policy: Policy::default(),
        compat_factors: None,
        enforce_compat: true,
    };
    let tensors = |side: u64, rank: u64| -> Vec<KvTensor> {
        (0..2u64)
            .map(|r| KvTensor {
                base: (side << 40) | ((rank + 1) << 32) | ((r + 1) << 24),
                len: 1 << 16,
            })
            .collect()
    };
    let mut decode = Worker::register(
        &mut nixl,
        cfg(
            "decode-0",
            EngineGeometry::new(1, 8, 16),
            0,
            true,
            MemKind::Dram,
        ),
        &tensors(1, 0),
    )
    .unwrap();
    for rank in 0..2 {
        let prefill = Worker::register(
            &mut nixl,
            cfg(
                &format!("prefill-{rank}"),
                EngineGeometry::new(2, 4, 8),
                rank,
                false,
                MemKind::Dram,
            ),
            &tensors(2, u64::from(rank)),
        )
        .unwrap();
        let mut meta = prefill.metadata(&mut nixl).unwrap();
        advertise(&mut meta);
        decode
            .add_remote_agent(&mut nixl, &meta, rank, 2)
            .map_err(|e| e.to_string())?;
    }
    let decode_agent = nixl
        .events()
        .iter()
        .find_map(|e| match e {
            Event::Dlist { agent, .. } => Some(*agent),
            _ => None,
        })
        .expect("decode registered first");
    Ok(nixl
        .events()
        .iter()
        .filter_map(|e| match e {
            Event::Dlist {
                agent, target, mem, ..
            } if *agent == decode_agent => Some((target.clone(), *mem)),
            _ => None,
        })
        .collect())
}

fn remote(name: &str) -> DlistTarget {
    DlistTarget::Remote(name.into())
}

#[test]
fn host_tensors_on_a_device_platform_follow_vllms_rule() {
    let lists = decode_lists(|_| {}).unwrap();
    use DlistTarget::Local;
    use MemKind::{Dram, Vram};
    assert_eq!(
        lists,
        [
            // Registration: the own list, in the regions' type.
            (Local, Dram),
            // Prefill rank 0: the list at prefill's kernel block (ratio 2),
            // the regions' type too; one split list per source rank (mamba
            // state comes from both), the platform's; the remote list, in
            // the type prefill advertised.
            (Local, Dram),
            (Local, Vram),
            (Local, Vram),
            (remote("prefill-0"), Dram),
            // Prefill rank 1: the local lists exist; its remote list.
            (remote("prefill-1"), Dram),
        ]
    );
}

#[test]
fn a_peer_that_advertises_no_types_gets_the_platforms() {
    let lists = decode_lists(|meta| meta.region_mem_types = None).unwrap();
    let remotes: Vec<_> = lists
        .iter()
        .filter(|(t, _)| matches!(t, DlistTarget::Remote(_)))
        .collect();
    assert_eq!(
        remotes,
        [
            &(remote("prefill-0"), MemKind::Vram),
            &(remote("prefill-1"), MemKind::Vram)
        ]
    );
}

#[test]
fn a_peer_with_mixed_region_types_is_refused() {
    let err = decode_lists(|meta| {
        meta.region_mem_types = Some(vec![MemKind::Vram, MemKind::Dram]);
    })
    .unwrap_err();
    assert_eq!(
        err,
        "handshake refused: NIXL pull does not yet support a mixed-memory producer: the peer's regions are [Vram, Dram]"
    );
}
