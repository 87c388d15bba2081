//! kvgeom's connector on one case: allocate both engines' memory, register
//! it, handshake, fill provenance patterns, transfer and post-process on the
//! placement the scenario chose, and keep everything the run produced (the
//! recorded transport, the resolved pairs, each rank's final memory, moved
//! out of its arenas) for the judge (`under_test::judge`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::connector::post_process::{zeroed_ranges, GroupPostProcess, PageGeometry};
use crate::connector::{ConnectorError, PlannedRead, ReadRequest, Worker, WriteRequest};
use crate::geometry::{Geometry, Mode};
use crate::layout::{CaseLayout, RequestBlocks, Side};
use crate::memory::{HostArena, MemKind};
use crate::nixl::{Loopback, Nixl, Recording};
use crate::oracle::{BeforeImage, MemoryImages, OracleInput};
use crate::pattern::{DecodeFill, InitialFill};
use crate::scheduler::{request_shape, RequestShape};

use super::case::{Case, CaseReport, MemoryKind, Outcome, Stats, TransportKind};
use super::engines::{allocate_ranks_touched, register_side_on, Engines, RankTensors};
use super::error::{PrefixHitError, TransportError};
use super::handshake_record::HandshakeRecord;
use super::memory_estimate::touched_prefill_ranks;
use super::placement::{place, Placement};
use super::vram::{self, CaseDevices};
use super::wait::{self, POLL_INTERVAL};

/// Both engines' tensors, rank by rank: prefill, then decode.
type SideTensors = [Vec<RankTensors>; 2];

/// How cases run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunOptions {
    pub transport: TransportKind,
    pub memory: MemoryKind,
    /// Decisions that replace the case variant's (a set of defects that no
    /// single variant names: `diff-trace`'s explanation search).
    pub policy: Option<crate::connector::Policy>,
    /// Host tensors under a platform that reports device memory (how the
    /// vLLM driver runs vLLM's connector): the workers' platform type is
    /// VRAM, and the lists vLLM's rule gives it are recorded as VRAM while
    /// the transport prepares them on host memory. Host memory only.
    pub device_platform: bool,
}

impl Default for RunOptions {
    fn default() -> Self {
        Self {
            transport: TransportKind::Loopback,
            memory: MemoryKind::Host,
            policy: None,
            device_platform: false,
        }
    }
}

/// Everything one case produced, for the judge, `explain` and the tests.
/// `report` is the judge's (`under_test::kvgeom::run_case_detailed`); a run
/// not judged yet holds a report without verdict.
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
    /// Each decode rank's attention page geometry per region (set once the
    /// transfers are over), which places the post-process's operations.
    pub decode_page_geometries: Vec<Vec<PageGeometry>>,
    pub oracle_input: Option<OracleInput>,
    /// Every handshake a rank attempted with a peer rank, in order.
    pub handshakes: Vec<HandshakeRecord>,
    /// Bytes the receive post-process zeroed on every decode rank (0 unless
    /// the transfers completed).
    pub zeroed_bytes: u64,
    /// A transfer reached a rank allocated without memory (the case is
    /// then run again with every rank's memory).
    pub unbacked_accessed: bool,
}

impl CaseRun {
    /// A case not run yet.
    pub fn new(case: &Case) -> Self {
        CaseRun {
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
            decode_page_geometries: Vec::new(),
            oracle_input: None,
            handshakes: Vec::new(),
            zeroed_bytes: 0,
            unbacked_accessed: false,
        }
    }
}

fn transport(
    opts: &RunOptions,
    arenas: &[HostArena],
    devices: Option<&CaseDevices>,
) -> Result<Box<dyn Nixl>, TransportError> {
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
            let mut nixl = crate::nixl::real::RealNixl::new()?;
            for a in arenas {
                nixl.attach(a.clone());
            }
            Ok(Box::new(nixl))
        }
        #[cfg(not(feature = "nixl"))]
        TransportKind::Nixl => Err(TransportError::NeedsNixl),
    }
}

/// Run one case through kvgeom's connector on `placement` (the scenario's
/// seeded placement of `shape`) and keep everything it produced, unjudged:
/// the returned outcome is the connector's (passed: the transfers
/// completed), before the oracles and the geometry's expectations.
pub fn run_placed(
    case: &Case,
    opts: &RunOptions,
    shape: &RequestShape,
    placement: &Placement,
) -> (CaseRun, Outcome) {
    let mut run = CaseRun::new(case);
    let mut outcome = execute(case, opts, shape, placement, &mut run, true);
    if run.unbacked_accessed {
        // A transfer reached a rank the estimate says none touches: run
        // the case again with every rank's memory, so the verdict is the
        // one the case earns.
        run = CaseRun::new(case);
        outcome = execute(case, opts, shape, placement, &mut run, false);
    }
    (run, outcome)
}

/// A case placed: the request's shape and the blocks it holds on each
/// engine, or why it cannot be placed (the harness's error).
pub type Placed = Result<(RequestShape, Placement), Outcome>;

/// The request's shape and its seeded placement among neighbour requests
/// in both engines' pools: which blocks it holds on each engine.
pub fn shape_and_place(case: &Case) -> Placed {
    let geometry = &case.geometry;
    check_prefix_hit(geometry, case.prompt_len, case.prefix_hit).map_err(Outcome::error)?;
    let shape = request_shape(geometry, case.prompt_len, case.prefix_hit, case.allocation);
    let placement = place(geometry, &shape, case.seed).map_err(|e| Outcome::Error {
        message: e.to_string(),
    })?;
    Ok((shape, placement))
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

/// With `sparse`, the prefill ranks no transfer touches get no memory (in
/// pull mode on host memory with the loopback transport: nothing else
/// reaches them); their arenas are addresses and sizes only.
fn execute(
    case: &Case,
    opts: &RunOptions,
    shape: &RequestShape,
    placement: &Placement,
    run: &mut CaseRun,
    sparse: bool,
) -> Outcome {
    let geometry = &case.geometry;
    let mode = case.mode;
    let sparse = sparse
        && mode == Mode::Pull
        && opts.memory == MemoryKind::Host
        && opts.transport == TransportKind::Loopback;
    let touched = sparse.then(|| touched_prefill_ranks(geometry, mode));
    let (p_arenas, d_arenas) = match allocate_ranks_touched(geometry, placement, touched.as_deref())
    {
        Ok(a) => a,
        Err(e) => return Outcome::error(e),
    };
    let unbacked: Vec<HostArena> = p_arenas
        .iter()
        .flatten()
        .filter(|a| !a.is_backed())
        .cloned()
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
            Err(e) => return Outcome::error(e),
        },
    };
    let inner = match transport(opts, &all, devices.as_ref()) {
        Ok(t) => t,
        Err(e) => return Outcome::error(e),
    };
    let inner: Box<dyn Nixl> = if opts.device_platform && devices.is_none() {
        Box::new(crate::nixl::HostAsDevice::new(inner))
    } else {
        inner
    };
    let platform = (opts.device_platform && devices.is_none()).then_some(MemKind::Vram);
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
    let policy = opts.policy.unwrap_or_else(|| case.variant.policy());
    let outcome = transfer(
        case, policy, platform, shape, placement, memory, &mut nixl, run, patient,
    );
    run.shape = Some(shape.clone());
    run.placement = Some(placement.clone());
    run.recording = Some(nixl);
    run.unbacked_accessed = unbacked.iter().any(HostArena::unbacked_accessed);
    outcome
}

#[allow(clippy::too_many_arguments)]
fn transfer(
    case: &Case,
    policy: crate::connector::Policy,
    platform: Option<MemKind>,
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
            policy,
            platform,
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
            policy,
            platform,
        ) {
            Ok(r) => r,
            Err(o) => return o,
        };
        Engines { prefill, decode }
    };
    // The harness's own layout model of both engines and the request.
    let blocks = placement.request_blocks(geometry, case.prefix_hit);
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
    // Fill: provenance on P, sentinel (and neighbour patterns) on D, with
    // the scheduler's alloc-time zeroing. Each arena fills on its first
    // access, so the memory of a rank no transfer touches is never written.
    let fills = initial_fills(&engines, geometry, shape, placement);
    // One layout, shared with the deferred fills (a fill still pending when
    // the case ends keeps its share: the layout is copied only then).
    let layout = Arc::new(layout);
    for (side, rank, fill) in &fills {
        let arenas = &engines.side(*side)[*rank as usize].arenas;
        if let Err(e) = fill.defer_to_arenas(&layout, arenas) {
            return Outcome::Error {
                message: e.to_string(),
            };
        }
    }
    // Real NIXL reads and writes the raw addresses, past the arenas: fill
    // every arena now.
    if patient {
        engines.settle_all();
    }
    if let Err(e) = engines.upload_to_devices() {
        return Outcome::error(e);
    }
    let log = &mut run.handshakes;
    let handshake = match mode {
        Mode::Pull => handshake_side(nixl, &mut engines, Side::Decode, Handshake::Initiator, log),
        Mode::Push => handshake_side(
            nixl,
            &mut engines,
            Side::Decode,
            Handshake::PushReceiver,
            log,
        )
        .and_then(|()| {
            handshake_side(nixl, &mut engines, Side::Prefill, Handshake::Initiator, log)
        }),
    };
    if let Err(outcome) = handshake {
        run.layout = Some(Arc::unwrap_or_clone(layout));
        return outcome;
    }
    let moved = match mode {
        Mode::Pull => {
            // Prefill's computed tokens travel in the transfer parameters
            // (`remote_num_tokens`): a decode scheduler loads nothing without
            // them, so every scheduled read carries them.
            let remote_num_tokens = geometry.transferred_tokens(case.prompt_len);
            pull(
                nixl,
                &mut engines,
                &blocks,
                geometry,
                remote_num_tokens,
                run,
                patient,
            )
        }
        Mode::Push => push(nixl, &mut engines, &blocks, geometry, run, patient),
    };
    if let Err(outcome) = moved {
        run.layout = Some(Arc::unwrap_or_clone(layout));
        return outcome;
    }
    if let Err(e) = engines.download_from_devices() {
        return Outcome::error(e);
    }
    // Oracles over the recorded pairs and both engines' memory.
    let pairs = nixl.resolve(&*layout);
    let mut input = OracleInput::new((*layout).clone(), case.prompt_len, case.prefix_hit, pairs)
        .with_transferred_tokens(shape.transferred_tokens);
    run.decode_page_geometries = engines
        .decode
        .iter()
        .map(|rank| rank.worker.page_geometries())
        .collect();
    let zeroed = zeroed_bytes(&run.post_process, &run.decode_page_geometries);
    // The transfers are over: the arenas' bytes become the final images; the
    // oracles recompute the initial fill instead of keeping a copy. A rank
    // whose fill never ran was never accessed: no pair may address it. A
    // rank with some regions accessed is judged whole: the others (e.g. a
    // slot without mamba state that no attention pair reached) get their
    // fill now.
    for (side, rank, fill) in fills {
        let arenas = &engines.side(side)[rank as usize].arenas;
        let accessed: Vec<_> = arenas
            .iter()
            .map(HostArena::take_bytes_if_accessed)
            .collect();
        let after: Option<Vec<_>> = accessed.iter().any(Option::is_some).then(|| {
            accessed
                .into_iter()
                .zip(arenas)
                .map(|(bytes, arena)| bytes.unwrap_or_else(|| arena.take_bytes()))
                .collect()
        });
        match after {
            Some(after) => input.set_memory(
                side,
                rank,
                MemoryImages {
                    before: BeforeImage::Recomputed(fill),
                    after,
                },
            ),
            None => {
                if let Some(pair) = input.pairs.iter().find(|p| {
                    [&p.source, &p.destination]
                        .iter()
                        .any(|e| e.location.side == Some(side) && e.location.rank == Some(rank))
                }) {
                    return Outcome::Error {
                        message: format!(
                            "harness: pair {} addresses {side} rank {rank}, whose memory the \
                             transport never accessed",
                            pair.id
                        ),
                    };
                }
                input.set_untouched(side, rank, fill);
            }
        }
    }
    run.zeroed_bytes = zeroed;
    run.oracle_input = Some(input);
    run.layout = Some(Arc::unwrap_or_clone(layout));
    Outcome::Passed
}

/// Every rank's initial fill: provenance on P; on D the sentinel with
/// neighbour patterns, and the scheduler's alloc-time zeroing.
fn initial_fills(
    engines: &Engines,
    geometry: &Geometry,
    shape: &RequestShape,
    placement: &Placement,
) -> Vec<(Side, u32, InitialFill)> {
    let zeroed = alloc_zeroed_blocks(geometry, shape, placement);
    let prefill =
        (0..engines.prefill.len() as u32).map(|r| (Side::Prefill, r, InitialFill::prefill(r)));
    let decode = (0..engines.decode.len() as u32).map(|r| {
        let fill = InitialFill::decode(r, DecodeFill::SentinelWithNeighbours, zeroed.clone());
        (Side::Decode, r, fill)
    });
    prefill.chain(decode).collect()
}

/// The scheduler's alloc-time zeroing: decode attention blocks of the
/// request that the transfer will not write (past the unzeroed ones) start
/// at zero; the others keep whatever the previous owner left (the sentinel).
pub fn alloc_zeroed_blocks(
    geometry: &Geometry,
    shape: &RequestShape,
    placement: &Placement,
) -> Vec<u32> {
    let hit = (shape.prefix_hit / geometry.decode.logical_block) as usize;
    let mut zeroed = Vec::new();
    for (g, blocks) in placement.decode.iter().enumerate() {
        let keep = hit + shape.decode_unzeroed_blocks[g] as usize;
        zeroed.extend(blocks.iter().skip(keep));
    }
    zeroed
}

/// [`alloc_zeroed_blocks`] applied to decode's arenas (`[rank][region]`).
pub fn zero_decode_at_allocation(
    decode: &[&[HostArena]],
    geometry: &Geometry,
    shape: &RequestShape,
    placement: &Placement,
) {
    let page = geometry.decode.unified_page_bytes(&geometry.model) as usize;
    for b in alloc_zeroed_blocks(geometry, shape, placement) {
        for arenas in decode {
            for arena in arenas.iter() {
                arena.write()[b as usize * page..(b as usize + 1) * page].fill(0);
            }
        }
    }
}

/// Bytes the post-process zeroed on every decode rank.
fn zeroed_bytes(post: &[(u32, Vec<GroupPostProcess>)], geometries: &[Vec<PageGeometry>]) -> u64 {
    post.iter()
        .flat_map(|(rank, plans)| zeroed_ranges(plans, &geometries[*rank as usize]))
        .map(|(_, _, len)| len)
        .sum()
}

/// A prefix hit is whole decode blocks, short of the transferred tokens
/// (a hit of all M tokens loads nothing), and needs prefix caching on D.
pub fn check_prefix_hit(
    geometry: &Geometry,
    prompt_len: u32,
    hit: u32,
) -> Result<(), PrefixHitError> {
    if prompt_len == 0 {
        return Err(PrefixHitError::EmptyPrompt);
    }
    if hit == 0 {
        return Ok(());
    }
    let block = geometry.decode.logical_block;
    let m = geometry.transferred_tokens(prompt_len);
    if !geometry.decode.prefix_caching {
        return Err(PrefixHitError::NoPrefixCaching {
            hit,
            geometry: geometry.name.clone(),
        });
    }
    if hit % block != 0 || hit >= m {
        return Err(PrefixHitError::NotWholeBlocks {
            hit,
            block,
            transferred: m,
        });
    }
    Ok(())
}

/// Decode's READ of the request (`req-d`, from prefill's `req-p` on
/// `prefill_tp` ranks), `computed` blocks per group already held,
/// `remote_num_tokens` as the proxy forwards it (or none).
pub fn read_request(
    blocks: &RequestBlocks,
    prefill_tp: u32,
    computed: Vec<u32>,
    remote_num_tokens: Option<u32>,
) -> ReadRequest {
    ReadRequest {
        request_id: "req-d".into(),
        local_block_ids: blocks.decode_transfer.clone(),
        remote_engine_id: Side::Prefill.as_str().into(),
        remote_request_id: "req-p".into(),
        remote_block_ids: blocks.prefill.clone(),
        remote_tp_size: prefill_tp,
        local_num_computed_blocks: computed,
        remote_num_tokens,
    }
}

/// D's prefix-hit blocks per group: the request's blocks the transfer skips.
pub fn computed_blocks(blocks: &RequestBlocks) -> Vec<u32> {
    blocks
        .decode
        .iter()
        .zip(&blocks.decode_transfer)
        .map(|(all, transfer)| (all.len() - transfer.len()) as u32)
        .collect()
}

/// How a rank adds the peer ranks it handshakes with.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Handshake {
    /// The initiator of the transfers (D in pull, P in push): the full handshake.
    Initiator,
    /// D in push mode: learns (and in kvgeom validates) the prefill engine.
    PushReceiver,
}

/// Every rank of `side` handshakes with its target ranks on the other side,
/// each attempt logged.
fn handshake_side(
    nixl: &mut dyn Nixl,
    engines: &mut Engines,
    side: Side,
    how: Handshake,
    log: &mut Vec<HandshakeRecord>,
) -> Result<(), Outcome> {
    let other = match side {
        Side::Prefill => Side::Decode,
        Side::Decode => Side::Prefill,
    };
    let peer_tp = engines.side(other).len() as u32;
    for i in 0..engines.side(side).len() {
        let targets = engines.side(side)[i]
            .worker
            .handshake_targets(peer_tp)
            .map_err(|e| Outcome::UnexpectedRejection {
                side,
                message: e.to_string(),
            })?;
        for target in targets {
            let meta = engines.side(other)[target as usize]
                .worker
                .metadata(nixl)
                .map_err(|e| crashed(other, e))?;
            let worker = &mut engines.side_mut(side)[i].worker;
            let added = match how {
                Handshake::Initiator => worker.add_remote_agent(nixl, &meta, target, peer_tp),
                Handshake::PushReceiver => worker.add_push_peer(nixl, &meta, target, peer_tp),
            };
            log.push(HandshakeRecord {
                agent: side.agent_name(i as u32),
                remote: other.agent_name(target),
                ok: added.is_ok(),
                message: added.as_ref().err().map(|e| match e {
                    ConnectorError::Handshake(h) => h.to_string(),
                    other => other.to_string(),
                }),
                notif_only: None,
            });
            match added {
                Ok(_) => {}
                Err(e) if side == Side::Prefill => {
                    return Err(push_refused(nixl, worker, target, e))
                }
                Err(e) => return Err(crashed(side, e)),
            }
        }
    }
    Ok(())
}

/// A prefill rank refused to push to decode rank `target`. vLLM 0.33.0 only
/// logs it, so decode waits forever; kvgeom tells decode why.
fn push_refused(nixl: &mut dyn Nixl, worker: &Worker, target: u32, e: ConnectorError) -> Outcome {
    let message = e.to_string();
    let rank = worker.config().tp_rank;
    match worker.refuse_push(nixl, &Side::Decode.agent_name(target), &e) {
        Ok(false) => Outcome::Hung {
            message: format!(
                "prefill rank {rank} refused the handshake ({message}) and decode got no signal: \
                 it waits for a push that never comes"
            ),
        },
        _ => crashed(Side::Prefill, e),
    }
}

fn pull(
    nixl: &mut dyn Nixl,
    engines: &mut Engines,
    blocks: &RequestBlocks,
    geometry: &Geometry,
    remote_num_tokens: u32,
    run: &mut CaseRun,
    patient: bool,
) -> Result<(), Outcome> {
    let limit = completion_limit(patient)?;
    for (d, rank) in engines.decode.iter_mut().enumerate() {
        let req = read_request(
            blocks,
            geometry.prefill.tp_size,
            computed_blocks(blocks),
            Some(remote_num_tokens),
        );
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
            if !patient || started.elapsed() > limit {
                let pending = wait::pending_reads(nixl, rank.worker.agent(), &recv.reads);
                return Err(Outcome::Hung {
                    message: format!(
                        "decode rank {d}: READs still in progress {}{}",
                        wait::waited(patient, limit),
                        wait::pending_text(&pending)
                    ),
                });
            }
            std::thread::sleep(POLL_INTERVAL);
        }
        let mut memory = rank.memory();
        let received = rank
            .worker
            .finish_read(nixl, &recv, &mut memory)
            .map_err(|e| crashed(Side::Decode, e))?;
        if let Some(e) = memory.error() {
            return Err(Outcome::error(e));
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
    let limit = completion_limit(patient)?;
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
            remote_num_computed_blocks: computed_blocks(blocks),
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
        let mut progress = worker
            .expect_push(Side::Prefill.as_str(), "req-d")
            .map_err(|e| Outcome::Error {
                message: format!("decode rank {d}: {e}"),
            })?;
        let started = Instant::now();
        loop {
            for (sender, message) in
                nixl.take_notifications(worker.agent())
                    .map_err(|e| Outcome::Error {
                        message: e.to_string(),
                    })?
            {
                if let Err(refused) = progress.receive(&sender, &message) {
                    return Err(Outcome::UnexpectedRejection {
                        side: Side::Prefill,
                        message: refused.reason,
                    });
                }
            }
            // In-process transports deliver at once; real NIXL delivers
            // once the WRITEs have landed.
            if progress.complete() || !patient || started.elapsed() > limit {
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
        if let Some(missing) = progress.missing() {
            let pending = wait::pending_writes(nixl, &writes);
            return Err(Outcome::Hung {
                message: format!(
                    "decode rank {d} never got the completion notification of {missing} {}{}",
                    wait::waited(patient, limit),
                    wait::pending_text(&pending)
                ),
            });
        }
        let mut memory = rank.memory();
        let plans = worker
            .finish_push(
                Side::Prefill.as_str(),
                &blocks.decode_transfer,
                &progress,
                &mut memory,
            )
            .map_err(|e| crashed(Side::Decode, e))?;
        if let Some(e) = memory.error() {
            return Err(Outcome::error(e));
        }
        run.post_process.push((d as u32, plans));
    }
    Ok(())
}

/// The completion limit of a case that waits for real NIXL; an unusable
/// setting is the harness's error, not the connector's.
fn completion_limit(patient: bool) -> Result<Duration, Outcome> {
    if !patient {
        return Ok(Duration::ZERO);
    }
    wait::completion_limit().map_err(Outcome::error)
}
