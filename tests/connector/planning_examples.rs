//! The worked examples of the specification, planned by the connector with
//! exact descriptor ids and zeroed ranges.

use kvgeom::connector::post_process::PostOp;
use kvgeom::connector::{
    HandshakeMetadata, KvTensor, NamedPolicy, Policy, ReadRequest, Receiving, Role, Worker,
    WorkerConfig,
};
use kvgeom::defects::Defect;
use kvgeom::geometry::{EngineGeometry, Mode, ModelSpec};
use kvgeom::memory::{HostArena, HostTensors};
use kvgeom::nixl::{DryRun, MemKind, Recording};

use kvgeom::internals::fixtures::mla_kda;

fn engine(tp: u32, kernel: u32, logical: u32) -> EngineGeometry {
    EngineGeometry::new(tp, kernel, logical)
}

struct Pair {
    nixl: Recording<DryRun>,
    decode: Worker,
    decode_memory: HostTensors,
}

/// D (rank 0) handshaken with every P rank, pools as given.
fn pair(
    model: &ModelSpec,
    d: EngineGeometry,
    d_pool: u32,
    p: EngineGeometry,
    p_pool: u32,
    defect: Option<Defect>,
) -> Pair {
    let policy = defect.map_or_else(Policy::default, Defect::policy);
    pair_with(model, d, d_pool, p, p_pool, policy)
}

/// [`pair`] with both engines under `policy`.
fn pair_with(
    model: &ModelSpec,
    d: EngineGeometry,
    d_pool: u32,
    p: EngineGeometry,
    p_pool: u32,
    policy: Policy,
) -> Pair {
    let mut nixl = Recording::new(DryRun::new());
    let cfg = |name: &str, e: &EngineGeometry, pool, rank, is_decode| WorkerConfig {
        engine_id: if is_decode { "decode" } else { "prefill" }.into(),
        agent_name: name.into(),
        model: model.clone(),
        engine: e.clone(),
        num_logical_blocks: pool,
        tp_rank: rank,
        role: Role::new(Mode::Pull, is_decode),
        mem: MemKind::Dram,
        platform_mem: MemKind::Dram,
        device: 0,
        policy,
        compat_factors: None,
        enforce_compat: true,
    };
    let d_page = d.unified_page_bytes(model) * u64::from(d_pool);
    let arenas: Vec<HostArena> = (0..2).map(|_| HostArena::new(d_page)).collect();
    let tensors: Vec<KvTensor> = arenas
        .iter()
        .map(|a| KvTensor {
            base: a.base(),
            len: a.len(),
        })
        .collect();
    let mut decode =
        Worker::register(&mut nixl, cfg("decode-0", &d, d_pool, 0, true), &tensors).unwrap();
    let p_len = p.unified_page_bytes(model) * u64::from(p_pool);
    for rank in 0..p.tp_size {
        let bases: Vec<KvTensor> = (0..2u64)
            .map(|r| KvTensor {
                base: (u64::from(rank) + 1) << 36 | (r + 1) << 28,
                len: p_len,
            })
            .collect();
        let prefill = Worker::register(
            &mut nixl,
            cfg(&format!("prefill-{rank}"), &p, p_pool, rank, false),
            &bases,
        )
        .unwrap();
        let meta: HandshakeMetadata = prefill.metadata(&mut nixl).unwrap();
        decode
            .add_remote_agent(&mut nixl, &meta, rank, p.tp_size)
            .unwrap();
    }
    Pair {
        nixl,
        decode,
        decode_memory: HostTensors(arenas),
    }
}

fn read(p: &mut Pair, local: Vec<Vec<u32>>, remote: Vec<Vec<u32>>, remote_tp: u32) -> Receiving {
    p.decode
        .start_read(&mut p.nixl, &request(local, remote, remote_tp, None))
        .unwrap()
}

/// The read request of the examples; `remote_num_tokens` as the transfer
/// parameters would carry it.
fn request(
    local: Vec<Vec<u32>>,
    remote: Vec<Vec<u32>>,
    remote_tp: u32,
    remote_num_tokens: Option<u32>,
) -> ReadRequest {
    ReadRequest {
        request_id: "req".into(),
        local_block_ids: local,
        remote_engine_id: "prefill".into(),
        remote_request_id: "req-p".into(),
        remote_block_ids: remote,
        remote_tp_size: remote_tp,
        local_num_computed_blocks: vec![0; 3],
        remote_num_tokens,
    }
}

fn range(a: u32, b: u32) -> Vec<u32> {
    (a..b).collect()
}

#[test]
fn twelve_vs_eight_token_blocks_at_n25() {
    // D logical 12 / kernel 4 (ppl 3), P logical 8 / kernel 4 (ppl 2), P TP2 -> D TP1.
    let model = mla_kda([2, 2, 4], 64);
    let mut p = pair(&model, engine(1, 4, 12), 10, engine(2, 4, 8), 10, None);
    // The PR's allocation model: D holds ceil(25 / 12) = 3 blocks, P ceil(24 / 8) = 3.
    let recv = read(
        &mut p,
        vec![vec![2, 5, 6], vec![0], vec![8]],
        vec![vec![4, 7, 9], vec![1], vec![0]],
        2,
    );
    assert_eq!(recv.reads.len(), 2);
    let r0 = &recv.reads[0];
    assert_eq!(
        r0.local_block_ids[0],
        vec![6, 7, 8, 15, 16, 17],
        "front-trimmed to the common 6 kernel blocks"
    );
    assert_eq!(r0.remote_block_ids[0], vec![8, 9, 14, 15, 18, 19]);
    // Region-major attention ids (NK_D = 30, NK_P = 20), then the state ids.
    assert_eq!(
        &r0.local_desc_ids[..12],
        &[6, 7, 8, 15, 16, 17, 36, 37, 38, 45, 46, 47]
    );
    assert_eq!(
        &r0.remote_desc_ids[..12],
        &[8, 9, 14, 15, 18, 19, 28, 29, 34, 35, 38, 39]
    );
    // kda_a: D slot 0 <- P slot 1, local stride 10 logical blocks from 60, remote 10 from 40.
    assert_eq!(
        &r0.local_desc_ids[12..20],
        &[60, 70, 80, 90, 100, 110, 120, 130]
    );
    assert_eq!(
        &r0.remote_desc_ids[12..20],
        &[41, 51, 61, 71, 81, 91, 101, 111]
    );
    assert!(
        recv.reads[1].local_block_ids[0].is_empty(),
        "rank 1 carries only its state shard"
    );
    // Receive: covered = min(9, 6) = 6, so D's third logical block (kernel 18..20) is zeroed whole.
    let plans = p.decode.plan_receive_post_process(&recv).unwrap();
    assert_eq!(plans.len(), 1);
    assert_eq!(plans[0].covered_sub_blocks, 6);
    assert_eq!(
        plans[0].ops,
        vec![
            PostOp::ZeroBlock { block: 18 },
            PostOp::ZeroBlock { block: 19 },
            PostOp::ZeroBlock { block: 20 }
        ]
    );
    // The old strict tolerance refuses this legitimate transfer.
    let mut strict = pair(
        &model,
        engine(1, 4, 12),
        10,
        engine(2, 4, 8),
        10,
        Some(Defect::StrictPrefixTolerance),
    );
    let req = request(
        vec![vec![2, 5, 6], vec![0], vec![8]],
        vec![vec![4, 7, 9], vec![1], vec![0]],
        2,
        None,
    );
    let err = strict
        .decode
        .start_read(&mut strict.nixl, &req)
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("|9 - 6| exceeds the padding bound 3"),
        "{err}"
    );
}

#[test]
fn kimi_linear_scale_tp8_to_tp1() {
    // D TP1 5760/64 (ppl 90, 4 logical blocks), P TP8 768/64 (ppl 12, 8 logical blocks).
    let model = mla_kda([16, 16, 32], 512);
    let mut p = pair(&model, engine(1, 64, 5760), 4, engine(8, 64, 768), 8, None);
    let recv = read(
        &mut p,
        vec![vec![1], vec![2], vec![3]],
        vec![vec![4, 6], vec![5], vec![7]],
        8,
    );
    assert_eq!(recv.reads.len(), 8, "one read per prefill rank");
    let r0 = &recv.reads[0];
    assert_eq!(
        r0.local_block_ids[0],
        range(90, 114),
        "front-trimmed to P's 24 kernel blocks"
    );
    let mut local_fa = range(90, 114);
    local_fa.extend(range(450, 474));
    let mut remote_fa = [
        range(48, 60),
        range(72, 84),
        range(144, 156),
        range(168, 180),
    ]
    .concat();
    remote_fa.truncate(48);
    assert_eq!(&r0.local_desc_ids[..48], &local_fa[..]);
    assert_eq!(&r0.remote_desc_ids[..48], &remote_fa[..]);
    let kda_a_local: Vec<u32> = (0..8).map(|u| 720 + 4 * u + 2).collect();
    let kda_a_remote: Vec<u32> = (0..8).map(|u| 192 + 8 * u + 5).collect();
    let kda_b_local: Vec<u32> = (0..8).map(|u| 720 + 4 * u + 3).collect();
    let kda_b_remote: Vec<u32> = (0..8).map(|u| 192 + 8 * u + 7).collect();
    assert_eq!(
        &r0.local_desc_ids[48..],
        &[kda_a_local.clone(), kda_b_local.clone()].concat()[..]
    );
    assert_eq!(
        &r0.remote_desc_ids[48..],
        &[kda_a_remote.clone(), kda_b_remote.clone()].concat()[..]
    );
    for read in &recv.reads[1..] {
        assert_eq!(
            read.local_desc_ids,
            [kda_a_local.clone(), kda_b_local.clone()].concat()
        );
        assert_eq!(
            read.remote_desc_ids,
            [kda_a_remote.clone(), kda_b_remote.clone()].concat()
        );
    }
    // Split lists place shard p of the SSM state at +64p of D's 512-byte state.
    let xfers = p.nixl.xfers();
    // The 4th state id of kda_a (u = 3: the SSM state) of rank 0 and of rank 5.
    let row = |x: usize, at: usize| {
        xfers[x]
            .local_list
            .get(u64::from(xfers[x].local_ids[at]))
            .unwrap()
    };
    let (d0, d5) = (row(0, 48 + 3), row(5, 3));
    assert_eq!((d0.len, d5.len), (64, 64));
    assert_eq!(d5.addr - d0.addr, 5 * 64);
    // Receive: covered = min(90, 24) = 24: kernel positions 24..89 (66 pages) zeroed.
    let plans = p.decode.plan_receive_post_process(&recv).unwrap();
    let zeroed: Vec<u32> = plans[0]
        .ops
        .iter()
        .map(|op| match op {
            PostOp::ZeroBlock { block } => *block,
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    assert_eq!(zeroed, range(114, 180));
}

#[test]
fn kernel_8_vs_4_with_ppl_3_vs_2_at_n29() {
    // D 24/8 (ppl 3), P 8/4 (ppl 2), block_size_ratio 2, P TP2 -> D TP1.
    let model = mla_kda([2, 2, 4], 64);
    let mut p = pair(&model, engine(1, 8, 24), 8, engine(2, 4, 8), 12, None);
    let recv = read(
        &mut p,
        vec![vec![1, 3], vec![0], vec![6]],
        vec![vec![2, 4, 6, 8], vec![1], vec![0]],
        2,
    );
    let r0 = &recv.reads[0];
    assert_eq!(
        r0.local_block_ids[0],
        vec![6, 7, 8, 9, 10, 11, 18, 19],
        "sub-blocks clipped to P's 8"
    );
    let local_fa = [
        vec![6, 7, 8, 9, 10, 11, 18, 19],
        vec![54, 55, 56, 57, 58, 59, 66, 67],
    ]
    .concat();
    let remote_fa = [
        vec![4, 5, 8, 9, 12, 13, 16, 17],
        vec![28, 29, 32, 33, 36, 37, 40, 41],
    ]
    .concat();
    assert_eq!(&r0.local_desc_ids[..16], &local_fa[..]);
    assert_eq!(&r0.remote_desc_ids[..16], &remote_fa[..]);
    let state: Vec<u32> = (0..8)
        .map(|s| 96 + 8 * s)
        .chain((0..8).map(|s| 102 + 8 * s))
        .collect();
    let remote_state: Vec<u32> = (0..8)
        .map(|s| 49 + 12 * s)
        .chain((0..8).map(|s| 48 + 12 * s))
        .collect();
    assert_eq!(&r0.local_desc_ids[16..], &state[..]);
    assert_eq!(&r0.remote_desc_ids[16..], &remote_state[..]);
    // Receive: covered = min(6 x 2, 8) = 8 -> (4, 0): kernel blocks 10 and 11 zeroed whole,
    // i.e. bytes [960, 1152) of every region (the last 192 bytes of logical block 3).
    let mut memory = p.decode_memory.clone();
    for a in &memory.0 {
        a.write().fill(0xAA);
    }
    let done = p
        .decode
        .finish_read(&mut p.nixl, &recv, &mut memory)
        .unwrap();
    assert_eq!(
        done.post_process[0].ops,
        vec![
            PostOp::ZeroBlock { block: 10 },
            PostOp::ZeroBlock { block: 11 }
        ]
    );
    for a in &memory.0 {
        let bytes = a.read();
        assert!(bytes[960..1152].iter().all(|&b| b == 0));
        assert!(
            bytes[..960].iter().all(|&b| b == 0xAA),
            "nothing before the clipped tail is touched"
        );
        assert!(bytes[1152..].iter().all(|&b| b == 0xAA));
    }
    // The old two-path zeroing leaves those 192 bytes per region stale.
    let mut old = pair(
        &model,
        engine(1, 8, 24),
        8,
        engine(2, 4, 8),
        12,
        Some(Defect::TwoPathZeroing),
    );
    let recv = read(
        &mut old,
        vec![vec![1, 3], vec![0], vec![6]],
        vec![vec![2, 4, 6, 8], vec![1], vec![0]],
        2,
    );
    assert!(old.decode.plan_receive_post_process(&recv).unwrap()[0]
        .ops
        .is_empty());
}

#[test]
fn partial_tail_of_the_last_covered_block() {
    // D 24/8 (ppl 3) <- P 12/4 (ppl 3), r = 2, N = 13 (M = 12): 3 of 6 sub-blocks covered.
    let model = mla_kda([2, 2, 4], 64);
    let mut p = pair(&model, engine(1, 8, 24), 8, engine(1, 4, 12), 8, None);
    let recv = read(
        &mut p,
        vec![vec![2], vec![0], vec![5]],
        vec![vec![3], vec![1], vec![2]],
        1,
    );
    assert_eq!(recv.reads[0].local_block_ids[0], vec![12, 13, 14]);
    let plans = p.decode.plan_receive_post_process(&recv).unwrap();
    assert_eq!(plans[0].covered_sub_blocks, 3);
    // Tokens 4..8 of the block at list position 1, then the block at position 2.
    assert_eq!(
        plans[0].ops,
        vec![
            PostOp::ZeroTokens {
                block: 7,
                from_token: 4
            },
            PostOp::ZeroBlock { block: 8 }
        ]
    );
}

/// vLLM 0.34.0's pull across different block sizes on G1 (D TP1 12/4, ppl
/// 3 <- P TP2 8/4, ppl 2) at N = 13: prefill computed 12 tokens into its
/// logical blocks [5, 2] (kernel 10, 11, 4 and the padding block 5).
#[test]
fn last_token_pairing_on_g1_at_n13() {
    let model = mla_kda([2, 2, 4], 64);
    let newer = NamedPolicy::from_name("vllm-0.34.0").unwrap().policy();
    let remote = || vec![vec![5, 2], vec![4], vec![3]];
    // Mainline: D holds one logical block; the padding kernel block 5 of
    // prefill is dropped and the lists pair token for token.
    let mut p = pair_with(&model, engine(1, 4, 12), 10, engine(2, 4, 8), 10, newer);
    let req = request(vec![vec![0], vec![2], vec![6]], remote(), 2, Some(12));
    let recv = p.decode.start_read(&mut p.nixl, &req).unwrap();
    assert_eq!(recv.reads[0].local_block_ids[0], vec![0, 1, 2]);
    assert_eq!(recv.reads[0].remote_block_ids[0], vec![10, 11, 4]);
    assert_eq!(recv.covered_sub_blocks, Some(vec![0..3, 0..1, 0..1]));
    assert!(p.decode.plan_receive_post_process(&recv).unwrap()[0]
        .ops
        .is_empty());
    // With the last-token block D holds two logical blocks: prefill's tokens
    // 0..12 go to D's blocks for tokens 12..24 and its first three kernel
    // blocks are zeroed.
    let mut p = pair_with(&model, engine(1, 4, 12), 10, engine(2, 4, 8), 10, newer);
    let req = request(vec![vec![0, 1], vec![2], vec![6]], remote(), 2, Some(12));
    let recv = p.decode.start_read(&mut p.nixl, &req).unwrap();
    assert_eq!(recv.reads[0].local_block_ids[0], vec![3, 4, 5]);
    assert_eq!(recv.reads[0].remote_block_ids[0], vec![10, 11, 4]);
    let plans = p.decode.plan_receive_post_process(&recv).unwrap();
    assert_eq!(
        (
            plans[0].first_covered_sub_block,
            plans[0].covered_sub_blocks
        ),
        (3, 6)
    );
    assert_eq!(
        plans[0].ops,
        vec![
            PostOp::ZeroBlock { block: 0 },
            PostOp::ZeroBlock { block: 1 },
            PostOp::ZeroBlock { block: 2 }
        ]
    );
    // kvgeom pairs from the first token: D's tokens 0..12 get prefill's.
    let mut own = pair(&model, engine(1, 4, 12), 10, engine(2, 4, 8), 10, None);
    let recv = own
        .decode
        .start_read(
            &mut own.nixl,
            &request(vec![vec![0, 1], vec![2], vec![6]], remote(), 2, Some(12)),
        )
        .unwrap();
    assert_eq!(recv.reads[0].local_block_ids[0], vec![0, 1, 2, 3]);
    assert_eq!(recv.reads[0].remote_block_ids[0], vec![10, 11, 4, 5]);
    // Without prefill's token count in the request, the read is declined.
    let mut p = pair_with(&model, engine(1, 4, 12), 10, engine(2, 4, 8), 10, newer);
    let req = request(vec![vec![0], vec![2], vec![6]], remote(), 2, None);
    let err = p.decode.start_read(&mut p.nixl, &req).unwrap_err();
    assert!(
        err.to_string().contains("require remote_num_tokens"),
        "{err}"
    );
}
