//! Running one case end to end: allocate both engines' memory, register it,
//! handshake, place the request among neighbours, fill provenance patterns,
//! transfer, post-process, and hand everything to the oracles.

use crate::connector::post_process::{GroupPostProcess, PageGeometry, PostOp};
use crate::connector::push::{parse_completion, PUSH_REJECT_PREFIX};
use crate::connector::scheduler::{request_shape, RequestShape};
use crate::connector::{ConnectorError, PlannedRead, ReadRequest, WriteRequest};
use crate::geometry::{Geometry, Mode};
use crate::layout::{CaseLayout, RequestBlocks, Side};
use crate::memory::HostArena;
use crate::nixl::{Loopback, Nixl, Recording};
use crate::oracle::{self, MemoryImages, OracleInput};
use crate::pattern::{self, DecodeFill};
use std::time::{Duration, Instant};

use super::case::{Case, CaseReport, MemoryKind, Outcome, Stats, TransportKind};
use super::engines::{allocate, register_side_on, Engines, RankTensors};
use super::placement::{place, Placement};
use super::vram::{self, CaseDevices, RankMemory};

/// Both engines' tensors, rank by rank: prefill, then decode.
type SideTensors = [Vec<RankTensors>; 2];

/// How long a case waits for transfers to complete (real NIXL moves bytes
/// in the background) before calling the request hung.
const COMPLETION_LIMIT: Duration = Duration::from_secs(60);
const POLL_INTERVAL: Duration = Duration::from_millis(1);

/// How cases run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunOptions {
    pub transport: TransportKind,
    pub memory: MemoryKind,
}

impl Default for RunOptions {
    fn default() -> Self {
        Self {
            transport: TransportKind::Loopback,
            memory: MemoryKind::Host,
        }
    }
}

/// Everything one case produced, for `explain` and the tests.
pub struct CaseRun {
    pub report: CaseReport,
    pub shape: Option<RequestShape>,
    pub placement: Option<Placement>,
    pub layout: Option<CaseLayout>,
    pub recording: Option<Recording<Box<dyn Nixl>>>,
    /// Transfers planned per (side, rank) of the initiator.
    pub transfers: Vec<(Side, u32, Vec<PlannedRead>)>,
    /// Post-process per decode rank.
    pub post_process: Vec<(u32, Vec<GroupPostProcess>)>,
    pub oracle_input: Option<OracleInput>,
}

/// Run one case and report it.
pub fn run_case(case: &Case, opts: &RunOptions) -> CaseReport {
    run_case_detailed(case, opts).report
}

fn transport(
    opts: &RunOptions,
    arenas: &[HostArena],
    devices: Option<&CaseDevices>,
) -> Result<Box<dyn Nixl>, String> {
    if let Some(devices) = devices {
        return vram::transport(opts.transport, devices);
    }
    match opts.transport {
        TransportKind::Loopback => {
            let mut lb = Loopback::new();
            for a in arenas {
                lb.attach(a.clone());
            }
            Ok(Box::new(lb))
        }
        #[cfg(feature = "nixl")]
        TransportKind::Nixl => {
            let mut nixl = crate::nixl::real::RealNixl::new().map_err(|e| e.to_string())?;
            for a in arenas {
                nixl.attach(a.clone());
            }
            Ok(Box::new(nixl))
        }
        #[cfg(not(feature = "nixl"))]
        TransportKind::Nixl => Err(
            "--transport nixl needs kvgeom built with `--features nixl` \
             and the NIXL runtime (scripts/install-nixl-runtime.sh)"
                .into(),
        ),
    }
}

/// Run one case and keep everything it produced.
pub fn run_case_detailed(case: &Case, opts: &RunOptions) -> CaseRun {
    let mut run = CaseRun {
        report: CaseReport {
            case: case.clone(),
            outcome: Outcome::Passed,
            stats: Stats::default(),
            violations: Vec::new(),
        },
        shape: None,
        placement: None,
        layout: None,
        recording: None,
        transfers: Vec::new(),
        post_process: Vec::new(),
        oracle_input: None,
    };
    let outcome = execute(case, opts, &mut run);
    run.report.outcome = judge(&case.geometry, outcome, &run.report.violations);
    run
}

/// Apply the geometry's expectation about rejections.
fn judge(geometry: &Geometry, outcome: Outcome, violations: &[oracle::Violation]) -> Outcome {
    match (outcome, &geometry.expect_rejection) {
        (Outcome::UnexpectedRejection { side, message }, Some(expected))
            if message.contains(expected.as_str()) =>
        {
            Outcome::ExpectedRejection { side, message }
        }
        (Outcome::Passed, Some(expected)) | (Outcome::Violations, Some(expected)) => {
            Outcome::MissingRejection {
                expected: expected.clone(),
            }
        }
        (Outcome::Passed, None) if !violations.is_empty() => Outcome::Violations,
        (other, _) => other,
    }
}

fn crashed(side: Side, e: ConnectorError) -> Outcome {
    match e {
        ConnectorError::Handshake(h) => Outcome::UnexpectedRejection {
            side,
            message: h.to_string(),
        },
        other => Outcome::Crashed {
            side,
            message: other.to_string(),
        },
    }
}

fn execute(case: &Case, opts: &RunOptions, run: &mut CaseRun) -> Outcome {
    let geometry = &case.geometry;
    let mode = case.mode;
    let shape = request_shape(geometry, case.prompt_len, case.prefix_hit, case.allocation);
    let placement = match place(geometry, &shape, case.seed) {
        Ok(p) => p,
        Err(e) => {
            return Outcome::Error {
                message: e.to_string(),
            }
        }
    };
    let p_arenas: Vec<Vec<HostArena>> = (0..geometry.prefill.tp_size)
        .map(|_| allocate(geometry, &geometry.prefill, placement.prefill_pool))
        .collect();
    let d_arenas: Vec<Vec<HostArena>> = (0..geometry.decode.tp_size)
        .map(|_| allocate(geometry, &geometry.decode, placement.decode_pool))
        .collect();
    let all: Vec<HostArena> = p_arenas
        .iter()
        .chain(&d_arenas)
        .flatten()
        .cloned()
        .collect();
    let devices = match opts.memory {
        MemoryKind::Host => None,
        MemoryKind::Vram => match vram::mirror(&p_arenas, &d_arenas) {
            Ok(d) => Some(d),
            Err(message) => return Outcome::Error { message },
        },
    };
    let inner = match transport(opts, &all, devices.as_ref()) {
        Ok(t) => t,
        Err(message) => return Outcome::Error { message },
    };
    let mut nixl = Recording::new(inner);
    let (p_devices, d_devices) = match devices {
        Some(c) => (Some(c.prefill), Some(c.decode)),
        None => (None, None),
    };
    let memory = [
        RankTensors::per_rank(p_arenas, p_devices),
        RankTensors::per_rank(d_arenas, d_devices),
    ];
    // Real NIXL completes transfers and delivers notifications in the
    // background; the in-process transports finish inside the post.
    let patient = opts.transport == TransportKind::Nixl;
    let outcome = transfer(case, &shape, &placement, memory, &mut nixl, run, patient);
    run.shape = Some(shape);
    run.placement = Some(placement);
    run.recording = Some(nixl);
    let _ = mode;
    outcome
}

fn transfer(
    case: &Case,
    shape: &RequestShape,
    placement: &Placement,
    memory: SideTensors,
    nixl: &mut Recording<Box<dyn Nixl>>,
    run: &mut CaseRun,
    patient: bool,
) -> Outcome {
    let geometry = &case.geometry;
    let mode = case.mode;
    let [p_ranks, d_ranks] = memory;
    let mut engines = {
        let prefill = match register_side_on(
            nixl,
            geometry,
            Side::Prefill,
            mode,
            placement.prefill_pool,
            p_ranks,
            case.defect,
        ) {
            Ok(r) => r,
            Err(o) => return o,
        };
        let decode = match register_side_on(
            nixl,
            geometry,
            Side::Decode,
            mode,
            placement.decode_pool,
            d_ranks,
            case.defect,
        ) {
            Ok(r) => r,
            Err(o) => return o,
        };
        Engines { prefill, decode }
    };
    // The harness's own layout model of both engines and the request.
    let blocks = RequestBlocks::with_prefix_hit(
        &geometry.model,
        geometry.decode.logical_block,
        placement.decode.clone(),
        placement.prefill.clone(),
        case.prefix_hit,
    );
    let layout = match CaseLayout::from_bases(
        (**geometry).clone(),
        mode,
        blocks.clone(),
        engines.bases(Side::Decode),
        placement.decode_pool,
        engines.bases(Side::Prefill),
        placement.prefill_pool,
    ) {
        Ok(l) => l,
        Err(e) => {
            return Outcome::Error {
                message: format!("layout model: {e}"),
            }
        }
    };
    // Fill: provenance on P, sentinel (and neighbour patterns) on D.
    for (rank, r) in engines.prefill.iter().enumerate() {
        if let Err(e) = pattern::fill_prefill_arenas(&layout, rank as u32, &r.arenas) {
            return Outcome::Error {
                message: e.to_string(),
            };
        }
    }
    for (rank, r) in engines.decode.iter().enumerate() {
        if let Err(e) = pattern::fill_decode_arenas(
            &layout,
            rank as u32,
            &r.arenas,
            DecodeFill::SentinelWithNeighbours,
        ) {
            return Outcome::Error {
                message: e.to_string(),
            };
        }
    }
    if let Err(message) = vram::upload(&engines) {
        return Outcome::Error { message };
    }
    let before = snapshot(&engines);
    let handshake = match mode {
        Mode::Pull => handshake_pull(nixl, &mut engines, geometry),
        Mode::Push => handshake_push(nixl, &mut engines, geometry),
    };
    if let Err(outcome) = handshake {
        run.layout = Some(layout);
        return outcome;
    }
    let moved = match mode {
        Mode::Pull => pull(nixl, &mut engines, &blocks, geometry, run, patient),
        Mode::Push => push(nixl, &mut engines, &blocks, geometry, run, patient),
    };
    if let Err(outcome) = moved {
        run.layout = Some(layout);
        return outcome;
    }
    if let Err(message) = vram::download(&engines) {
        return Outcome::Error { message };
    }
    // Oracles over the recorded pairs and both engines' memory.
    let pairs = nixl.resolve(&layout);
    let mut input = OracleInput::new(layout.clone(), case.prompt_len, case.prefix_hit, pairs)
        .with_transferred_tokens(shape.transferred_tokens);
    let after = snapshot(&engines);
    for side in [Side::Prefill, Side::Decode] {
        for (rank, (b, a)) in before
            .images(side)
            .iter()
            .zip(after.images(side))
            .enumerate()
        {
            input.set_memory(
                side,
                rank as u32,
                MemoryImages {
                    before: b.clone(),
                    after: a.clone(),
                },
            );
        }
    }
    let violations = oracle::run_all(&input);
    run.report.stats = stats(&input, &run.post_process, &engines);
    run.report.violations = violations;
    run.oracle_input = Some(input);
    run.layout = Some(layout);
    Outcome::Passed
}

struct Images {
    prefill: Vec<Vec<Vec<u8>>>,
    decode: Vec<Vec<Vec<u8>>>,
}

impl Images {
    fn images(&self, side: Side) -> &[Vec<Vec<u8>>] {
        match side {
            Side::Prefill => &self.prefill,
            Side::Decode => &self.decode,
        }
    }
}

fn snapshot(engines: &Engines) -> Images {
    let side = |ranks: &[super::engines::Rank]| {
        ranks
            .iter()
            .map(|r| r.arenas.iter().map(HostArena::snapshot).collect())
            .collect()
    };
    Images {
        prefill: side(&engines.prefill),
        decode: side(&engines.decode),
    }
}

fn stats(input: &OracleInput, post: &[(u32, Vec<GroupPostProcess>)], engines: &Engines) -> Stats {
    let posted: Vec<_> = input.posted_pairs().collect();
    let mut zeroed = 0;
    for (rank, plans) in post {
        let geometries: Vec<PageGeometry> = engines.decode[*rank as usize].worker.page_geometries();
        for plan in plans {
            for op in &plan.ops {
                for g in &geometries {
                    zeroed += match *op {
                        PostOp::ZeroBlock { .. } => g.block_len,
                        PostOp::ZeroTokens { block, from_token } => g
                            .token_tail_ranges(block, u64::from(from_token))
                            .iter()
                            .map(|(_, len)| len)
                            .sum(),
                        PostOp::ConvertBlockSize { .. } => 0,
                    };
                }
            }
        }
    }
    Stats {
        pairs: posted.len() as u64,
        transferred_bytes: posted.iter().map(|p| p.destination.row.len).sum(),
        zeroed_bytes: zeroed,
    }
}

fn handshake_pull(
    nixl: &mut dyn Nixl,
    engines: &mut Engines,
    geometry: &Geometry,
) -> Result<(), Outcome> {
    let p_tp = geometry.prefill.tp_size;
    for d in 0..engines.decode.len() {
        let targets = engines.decode[d]
            .worker
            .handshake_targets(p_tp)
            .map_err(|e| Outcome::UnexpectedRejection {
                side: Side::Decode,
                message: e.to_string(),
            })?;
        for target in targets {
            let meta = engines.prefill[target as usize]
                .worker
                .metadata(nixl)
                .map_err(|e| crashed(Side::Prefill, e))?;
            engines.decode[d]
                .worker
                .add_remote_agent(nixl, &meta, target, p_tp)
                .map_err(|e| crashed(Side::Decode, e))?;
        }
    }
    Ok(())
}

fn handshake_push(
    nixl: &mut dyn Nixl,
    engines: &mut Engines,
    geometry: &Geometry,
) -> Result<(), Outcome> {
    let (p_tp, d_tp) = (geometry.prefill.tp_size, geometry.decode.tp_size);
    // D learns (and, in kvgeom, validates) P.
    for d in 0..engines.decode.len() {
        let targets = engines.decode[d]
            .worker
            .handshake_targets(p_tp)
            .map_err(|e| Outcome::UnexpectedRejection {
                side: Side::Decode,
                message: e.to_string(),
            })?;
        for target in targets {
            let meta = engines.prefill[target as usize]
                .worker
                .metadata(nixl)
                .map_err(|e| crashed(Side::Prefill, e))?;
            engines.decode[d]
                .worker
                .add_push_peer(nixl, &meta, target, p_tp)
                .map_err(|e| crashed(Side::Decode, e))?;
        }
    }
    // P handshakes with every decode rank it writes to.
    for p in 0..engines.prefill.len() {
        let targets = engines.prefill[p]
            .worker
            .handshake_targets(d_tp)
            .map_err(|e| Outcome::UnexpectedRejection {
                side: Side::Prefill,
                message: e.to_string(),
            })?;
        for target in targets {
            let meta = engines.decode[target as usize]
                .worker
                .metadata(nixl)
                .map_err(|e| crashed(Side::Decode, e))?;
            if let Err(e) = engines.prefill[p]
                .worker
                .add_remote_agent(nixl, &meta, target, d_tp)
            {
                let message = e.to_string();
                let vllm_push = engines.prefill[p].worker.config().defect.is_some_and(|d| {
                    matches!(
                        d,
                        crate::defects::Defect::PushEmptyRemoteIds
                            | crate::defects::Defect::PushOneWayRatio
                    )
                });
                if vllm_push {
                    return Err(Outcome::Hung {
                        message: format!(
                            "prefill rank {p} refused the handshake ({message}) and decode got no signal: \
                             it waits for a push that never comes"
                        ),
                    });
                }
                // kvgeom: tell decode why, so it fails the request loudly.
                let agent = engines.prefill[p].worker.agent();
                let reason = format!("{PUSH_REJECT_PREFIX}{message}");
                let _ = nixl.send_notification(
                    agent,
                    &crate::layout::Side::Decode.agent_name(target),
                    reason.as_bytes(),
                );
                return Err(crashed(Side::Prefill, e));
            }
        }
    }
    Ok(())
}

fn pull(
    nixl: &mut dyn Nixl,
    engines: &mut Engines,
    blocks: &RequestBlocks,
    geometry: &Geometry,
    run: &mut CaseRun,
    patient: bool,
) -> Result<(), Outcome> {
    for (d, rank) in engines.decode.iter_mut().enumerate() {
        let req = ReadRequest {
            request_id: "req-d".into(),
            local_block_ids: blocks.decode_transfer.clone(),
            remote_engine_id: Side::Prefill.as_str().into(),
            remote_request_id: "req-p".into(),
            remote_block_ids: blocks.prefill.clone(),
            remote_tp_size: geometry.prefill.tp_size,
        };
        let recv = rank
            .worker
            .start_read(nixl, &req)
            .map_err(|e| crashed(Side::Decode, e))?;
        run.transfers
            .push((Side::Decode, d as u32, recv.reads.clone()));
        let started = Instant::now();
        while !rank
            .worker
            .reads_done(nixl, &recv)
            .map_err(|e| crashed(Side::Decode, e))?
        {
            if !patient || started.elapsed() > COMPLETION_LIMIT {
                return Err(Outcome::Hung {
                    message: format!("decode rank {d}: READs still in progress"),
                });
            }
            std::thread::sleep(POLL_INTERVAL);
        }
        let mut memory = RankMemory::of(rank);
        let received = rank
            .worker
            .finish_read(nixl, &recv, &mut memory)
            .map_err(|e| crashed(Side::Decode, e))?;
        if let Some(message) = memory.error() {
            return Err(Outcome::Error { message });
        }
        run.post_process.push((d as u32, received.post_process));
    }
    Ok(())
}

fn push(
    nixl: &mut dyn Nixl,
    engines: &mut Engines,
    blocks: &RequestBlocks,
    geometry: &Geometry,
    run: &mut CaseRun,
    patient: bool,
) -> Result<(), Outcome> {
    // Prefill's posted WRITEs, polled while decode waits (as a sender
    // checks its sends; real NIXL progresses them in the meantime).
    let mut writes = Vec::new();
    for (p, rank) in engines.prefill.iter_mut().enumerate() {
        let req = WriteRequest {
            request_id: "req-p".into(),
            local_block_ids: blocks.prefill.clone(),
            remote_engine_id: Side::Decode.as_str().into(),
            remote_request_id: "req-d".into(),
            remote_block_ids: blocks.decode_transfer.clone(),
            remote_tp_size: geometry.decode.tp_size,
        };
        let sending = rank
            .worker
            .start_write(nixl, &req)
            .map_err(|e| crashed(Side::Prefill, e))?;
        let agent = rank.worker.agent();
        writes.extend(
            sending
                .writes
                .iter()
                .filter_map(|w| w.xfer.map(|x| (agent, x))),
        );
        run.transfers
            .push((Side::Prefill, p as u32, sending.writes));
    }
    for (d, rank) in engines.decode.iter().enumerate() {
        let worker = &rank.worker;
        let engine = worker
            .remote(Side::Prefill.as_str())
            .ok_or_else(|| Outcome::Error {
                message: "decode has no prefill engine".into(),
            })?;
        let expected: Vec<String> = engine
            .mapping
            .all_source_ranks
            .iter()
            .map(|&r| Side::Prefill.agent_name(r))
            .collect();
        let mut covered = Vec::new();
        let mut seen = Vec::new();
        let started = Instant::now();
        loop {
            for (sender, message) in
                nixl.take_notifications(worker.agent())
                    .map_err(|e| Outcome::Error {
                        message: e.to_string(),
                    })?
            {
                let text = String::from_utf8_lossy(&message).to_string();
                if let Some(reason) = text.strip_prefix(PUSH_REJECT_PREFIX) {
                    return Err(Outcome::UnexpectedRejection {
                        side: Side::Prefill,
                        message: reason.to_string(),
                    });
                }
                if let Some((req, counts)) = parse_completion(&text) {
                    if req == "req-d" {
                        seen.push(sender);
                        covered.extend(counts);
                    }
                }
            }
            // In-process transports deliver at once; real NIXL delivers
            // once the WRITEs have landed.
            let all_seen = expected.iter().all(|e| seen.contains(e));
            if all_seen || !patient || started.elapsed() > COMPLETION_LIMIT {
                break;
            }
            for &(agent, xfer) in &writes {
                nixl.xfer_state(agent, xfer).map_err(|e| Outcome::Crashed {
                    side: Side::Prefill,
                    message: e.to_string(),
                })?;
            }
            std::thread::sleep(POLL_INTERVAL);
        }
        if let Some(missing) = expected.iter().find(|e| !seen.contains(e)) {
            return Err(Outcome::Hung {
                message: format!(
                    "decode rank {d} never got the completion notification of {missing}"
                ),
            });
        }
        let mut memory = RankMemory::of(rank);
        let plans = worker
            .finish_push(
                Side::Prefill.as_str(),
                &blocks.decode_transfer,
                &covered,
                &mut memory,
            )
            .map_err(|e| crashed(Side::Decode, e))?;
        if let Some(message) = memory.error() {
            return Err(Outcome::Error { message });
        }
        run.post_process.push((d as u32, plans));
    }
    Ok(())
}
