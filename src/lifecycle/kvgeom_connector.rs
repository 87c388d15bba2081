//! kvgeom's connector under a lifecycle scenario: the request handling of
//! vLLM's NIXL connector on both engines, as kvgeom implements it, over
//! shared block pools. Prefill computes a request into its blocks and
//! holds them under a lease (`kv_lease_duration`) that decode's heartbeats
//! renew, until decode's notification that it read them or the lease's
//! expiry (then reaped, as `_reap_expired_send_leases` does). Decode
//! allocates, posts one READ per request (one descriptor pair per run of
//! tokens a prefill block and a decode block share, and one for the mamba
//! state), zeroes its last block's tail when the READ completes, admits
//! its full blocks to its prefix cache at the first step, and frees its
//! blocks when the request ends. Every decision connectors have gotten
//! wrong is a field of its [`LifecyclePolicy`].

use crate::memory::{MemKind, MemRegion};
use crate::nixl::{
    AgentId, DescList, DescRow, DlistHandle, DlistTarget, Nixl, XferHandle, XferOp, XferState,
};

use super::content::{state_byte, token_byte};
use super::error::LifecycleError;
use super::operation::{Engine, Operation, RequestId};
use super::policy::{
    AbortInFlight, CompletionCheck, ExpiredLease, FailureReport, LifecyclePolicy, PrefillRelease,
    StateAtFirstStep,
};
use super::pools::{BlockKind, BlockRef};
use super::record::{End, Event, PairSpan, Span, WriteCause};
use super::seam::{Io, LifecycleConnector, ProxyMessage};
use super::shape::TOKEN_BYTES;

/// A computed request's lease, in heartbeat intervals (vLLM:
/// `kv_lease_duration` 30 s, one heartbeat every 30 / 6 = 5 s).
pub const LEASE_INTERVALS: u64 = 6;
/// How far a heartbeat extends a lease (vLLM: two thirds of the lease).
pub const HEARTBEAT_EXTENSION: u64 = 4;

/// Prefill's side of one request.
#[derive(Clone, Debug, PartialEq, Eq)]
enum PrefillState {
    Pending,
    Held {
        blocks: Vec<BlockRef>,
        state: Option<BlockRef>,
        expiry: u64,
    },
    Done,
}

/// Decode's side of one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum DecodeState {
    Waiting,
    Allocated,
    Receiving,
    /// Aborted with its READ in flight: the blocks wait for the last pair.
    Draining,
    Received,
    Decoding,
    Ended,
}

#[derive(Clone, Debug)]
struct Request {
    prompt: u32,
    hit: u32,
    prefill: PrefillState,
    decode: DecodeState,
    /// Prefill's blocks, once its proxy message arrived.
    remote: Option<(Vec<BlockRef>, Option<BlockRef>)>,
    /// Decode's own account of the lease's end.
    deadline: u64,
    blocks: Vec<BlockRef>,
    state: Option<BlockRef>,
    xfer: Option<XferHandle>,
    pairs_posted: usize,
    /// Prefill failed or aborted it and told decode.
    doomed: Option<End>,
}

/// kvgeom's connector on both engines.
pub struct KvgeomLifecycle {
    policy: LifecyclePolicy,
    requests: Vec<Request>,
    agents: Option<(AgentId, AgentId)>,
    regions: [Vec<MemRegion>; 2],
    handshaken: bool,
}

impl KvgeomLifecycle {
    /// The connector deciding as `policy` says.
    pub fn new(policy: LifecyclePolicy) -> Self {
        KvgeomLifecycle {
            policy,
            requests: Vec::new(),
            agents: None,
            regions: [Vec::new(), Vec::new()],
            handshaken: false,
        }
    }

    fn agents(&self) -> Result<(AgentId, AgentId), LifecycleError> {
        self.agents
            .ok_or_else(|| LifecycleError::Harness("the connector was not started".into()))
    }

    fn ignore(io: &mut Io<'_>, why: impl Into<String>) {
        io.emit(Event::Ignored { reason: why.into() });
    }

    /// `r`'s blocks and state block on `engine` ([`Io::allocate_request`]),
    /// or `None`, the operation ignored, when a pool is full.
    fn allocate_or_ignore(
        io: &mut Io<'_>,
        engine: Engine,
        n: u32,
        r: RequestId,
    ) -> Option<(Vec<BlockRef>, Option<BlockRef>)> {
        match io.allocate_request(engine, n, r) {
            Ok(blocks) => Some(blocks),
            Err(BlockKind::Attention) => {
                Self::ignore(io, format!("{engine}'s pool is full"));
                None
            }
            Err(BlockKind::State) => {
                Self::ignore(io, format!("{engine}'s state pool is full"));
                None
            }
        }
    }

    /// Decode loads prefill's metadata once (the handshake).
    fn handshake(&mut self, io: &mut Io<'_>) -> Result<(), LifecycleError> {
        if self.handshaken {
            return Ok(());
        }
        let (p, d) = self.agents()?;
        let meta = io.nixl.local_metadata(p)?;
        io.nixl.add_remote_agent(d, &meta)?;
        let meta = io.nixl.local_metadata(d)?;
        io.nixl.add_remote_agent(p, &meta)?;
        self.handshaken = true;
        Ok(())
    }

    /// Decode tells prefill something over NIXL.
    fn notify_prefill(&mut self, io: &mut Io<'_>, message: &str) -> Result<(), LifecycleError> {
        self.handshake(io)?;
        let (_, d) = self.agents()?;
        io.nixl
            .send_notification(d, "prefill", message.as_bytes())?;
        Ok(())
    }

    fn free_decode(&mut self, io: &mut Io<'_>, r: RequestId) {
        let req = &mut self.requests[r as usize];
        let blocks: Vec<_> = req.blocks.drain(..).chain(req.state.take()).collect();
        for b in blocks {
            io.free(b, r);
        }
    }

    fn free_prefill(&mut self, io: &mut Io<'_>, r: RequestId) {
        let req = &mut self.requests[r as usize];
        if let PrefillState::Held { blocks, state, .. } =
            std::mem::replace(&mut req.prefill, PrefillState::Done)
        {
            for b in blocks.into_iter().chain(state) {
                io.free(b, r);
            }
        }
    }

    fn end(&mut self, io: &mut Io<'_>, r: RequestId, end: End) {
        self.requests[r as usize].decode = DecodeState::Ended;
        io.emit(Event::Ended { request: r, end });
    }

    /// Decode ends a request that has not posted (or whose READ landed),
    /// frees its blocks and tells prefill.
    fn end_on_decode(
        &mut self,
        io: &mut Io<'_>,
        r: RequestId,
        end: End,
    ) -> Result<(), LifecycleError> {
        self.free_decode(io, r);
        self.end(io, r, end);
        if matches!(self.requests[r as usize].prefill, PrefillState::Held { .. }) {
            self.notify_prefill(io, &format!("release:{r}"))?;
        }
        Ok(())
    }

    fn compute(&mut self, io: &mut Io<'_>, r: RequestId) -> Result<(), LifecycleError> {
        let req = &self.requests[r as usize];
        if req.prefill != PrefillState::Pending || req.decode == DecodeState::Ended {
            Self::ignore(io, format!("r{r} is not waiting for prefill"));
            return Ok(());
        }
        let prompt = req.prompt;
        let n = io.shape.blocks_for(Engine::Prefill, prompt);
        let Some((blocks, state)) = Self::allocate_or_ignore(io, Engine::Prefill, n, r) else {
            return Ok(());
        };
        let per = io.shape.prefill_block_tokens;
        for (i, &b) in blocks.iter().enumerate() {
            let first = i as u32 * per;
            let (offset, len) = io.pools.span(b);
            let bytes: Vec<u8> = (0..per * TOKEN_BYTES)
                .map(|k| {
                    let t = first + k / TOKEN_BYTES;
                    if t < prompt {
                        token_byte(r, t, k % TOKEN_BYTES)
                    } else {
                        0
                    }
                })
                .collect();
            let span = Span {
                engine: Engine::Prefill,
                offset,
                len,
            };
            io.write(span, &bytes, r, WriteCause::Compute);
        }
        if let Some(s) = state {
            let (offset, len) = io.pools.span(s);
            let bytes: Vec<u8> = (0..len as u32).map(|k| state_byte(r, k)).collect();
            let span = Span {
                engine: Engine::Prefill,
                offset,
                len,
            };
            io.write(span, &bytes, r, WriteCause::Compute);
        }
        io.proxy.push(ProxyMessage::Ready {
            request: r,
            blocks: blocks.clone(),
            state,
        });
        self.requests[r as usize].prefill = PrefillState::Held {
            blocks,
            state,
            expiry: io.now + LEASE_INTERVALS,
        };
        if self.policy.prefill_release == PrefillRelease::AfterCompute {
            self.free_prefill(io, r);
        }
        Ok(())
    }

    fn allocate(&mut self, io: &mut Io<'_>, r: RequestId) -> Result<(), LifecycleError> {
        let req = &self.requests[r as usize];
        if req.decode != DecodeState::Waiting {
            Self::ignore(io, format!("r{r} is not waiting for decode's blocks"));
            return Ok(());
        }
        let (prompt, hit) = (req.prompt, req.hit);
        let n = io.shape.blocks_for(Engine::Decode, prompt);
        let Some((blocks, state)) = Self::allocate_or_ignore(io, Engine::Decode, n, r) else {
            return Ok(());
        };
        // The prefix hit: decode's cache holds the first `hit` blocks,
        // computed for the same tokens.
        let per = io.shape.decode_block_tokens;
        for (j, &b) in blocks.iter().enumerate().take(hit as usize) {
            let (offset, len) = io.pools.span(b);
            let bytes: Vec<u8> = (0..per * TOKEN_BYTES)
                .map(|k| token_byte(r, j as u32 * per + k / TOKEN_BYTES, k % TOKEN_BYTES))
                .collect();
            let span = Span {
                engine: Engine::Decode,
                offset,
                len,
            };
            io.write(span, &bytes, r, WriteCause::Compute);
        }
        let req = &mut self.requests[r as usize];
        req.blocks = blocks;
        req.state = state;
        req.decode = DecodeState::Allocated;
        Ok(())
    }

    /// The READ's pairs: every run of tokens past the prefix hit that one
    /// prefill block and one decode block share, and the state.
    fn pairs(&self, io: &Io<'_>, r: RequestId) -> Vec<PairSpan> {
        let req = &self.requests[r as usize];
        let Some((remote, remote_state)) = &req.remote else {
            return Vec::new();
        };
        let (pb, db) = (io.shape.prefill_block_tokens, io.shape.decode_block_tokens);
        let mut pairs = Vec::new();
        let mut t = req.hit * db;
        while t < req.prompt {
            let (i, j) = (t / pb, t / db);
            let end = ((i + 1) * pb).min((j + 1) * db).min(req.prompt);
            let (src, _) = io.pools.span(remote[i as usize]);
            let (dst, _) = io.pools.span(req.blocks[j as usize]);
            let len = u64::from((end - t) * TOKEN_BYTES);
            pairs.push(PairSpan {
                request: r,
                src: Span {
                    engine: Engine::Prefill,
                    offset: src + u64::from((t - i * pb) * TOKEN_BYTES),
                    len,
                },
                dst: Span {
                    engine: Engine::Decode,
                    offset: dst + u64::from((t - j * db) * TOKEN_BYTES),
                    len,
                },
            });
            t = end;
        }
        if let (Some(src), Some(dst)) = (remote_state, req.state) {
            let (s, len) = io.pools.span(*src);
            let (d, _) = io.pools.span(dst);
            pairs.push(PairSpan {
                request: r,
                src: Span {
                    engine: Engine::Prefill,
                    offset: s,
                    len,
                },
                dst: Span {
                    engine: Engine::Decode,
                    offset: d,
                    len,
                },
            });
        }
        pairs
    }

    fn post(&mut self, io: &mut Io<'_>, r: RequestId) -> Result<(), LifecycleError> {
        let req = &self.requests[r as usize];
        if req.decode != DecodeState::Allocated || req.remote.is_none() {
            Self::ignore(io, format!("r{r} has no blocks on both engines to read"));
            return Ok(());
        }
        if io.now >= req.deadline && self.policy.expired_lease == ExpiredLease::Fail {
            return self.end_on_decode(io, r, End::Failed);
        }
        self.handshake(io)?;
        let pairs = self.pairs(io, r);
        if pairs.is_empty() {
            // Everything was a prefix hit: nothing to read.
            self.receive(io, r)?;
            return Ok(());
        }
        let (_, d) = self.agents()?;
        let base = |engine: Engine, io: &Io<'_>| io.pools.arena(engine).base();
        let (pbase, dbase) = (base(Engine::Prefill, io), base(Engine::Decode, io));
        let row = |base: u64, s: &Span| DescRow {
            addr: base + s.offset,
            len: s.len,
            dev: 0,
        };
        let local = DescList::from_rows(pairs.iter().map(|p| row(dbase, &p.dst)));
        let remote = DescList::from_rows(pairs.iter().map(|p| row(pbase, &p.src)));
        let nixl = io.transport();
        let l: DlistHandle = nixl.prepare_dlist(d, &DlistTarget::Local, MemKind::Dram, &local)?;
        let target = DlistTarget::Remote("prefill".into());
        let rl: DlistHandle = nixl.prepare_dlist(d, &target, MemKind::Dram, &remote)?;
        let ids: Vec<u32> = (0..pairs.len() as u32).collect();
        let message = format!("done:{r}");
        let x = nixl.make_xfer(d, XferOp::Read, l, &ids, rl, &ids, Some(message.as_bytes()))?;
        let count = pairs.len();
        io.emit(Event::Posted {
            request: r,
            transfer: x.0,
            pairs,
        });
        let state = io.transport().post_xfer(d, x)?;
        io.transport().release_dlist(d, l)?;
        io.transport().release_dlist(d, rl)?;
        let req = &mut self.requests[r as usize];
        req.xfer = Some(x);
        req.pairs_posted = count;
        req.decode = DecodeState::Receiving;
        if state == XferState::Done {
            self.progress_decode(io)?;
        }
        Ok(())
    }

    /// Decode's READ of `r` is complete: zero the last block's tail.
    fn receive(&mut self, io: &mut Io<'_>, r: RequestId) -> Result<(), LifecycleError> {
        let req = &self.requests[r as usize];
        let per = io.shape.decode_block_tokens;
        let used = req.prompt - (req.blocks.len() as u32 - 1) * per;
        if used < per {
            let last = *req.blocks.last().expect("a request holds a block");
            let (offset, _) = io.pools.span(last);
            let span = Span {
                engine: Engine::Decode,
                offset: offset + u64::from(used * TOKEN_BYTES),
                len: u64::from((per - used) * TOKEN_BYTES),
            };
            io.write_fill(span, 0, r, WriteCause::Zeroing);
        }
        self.requests[r as usize].decode = DecodeState::Received;
        io.emit(Event::Received { request: r });
        Ok(())
    }

    fn step(&mut self, io: &mut Io<'_>, r: RequestId) -> Result<(), LifecycleError> {
        if self.requests[r as usize].decode != DecodeState::Received {
            Self::ignore(io, format!("r{r} has not received its KV"));
            return Ok(());
        }
        if self.policy.state_at_first_step == StateAtFirstStep::Clear {
            if let Some(s) = self.requests[r as usize].state {
                let (offset, len) = io.pools.span(s);
                let span = Span {
                    engine: Engine::Decode,
                    offset,
                    len,
                };
                io.write_fill(span, 0, r, WriteCause::StateClear);
            }
        }
        let req = &self.requests[r as usize];
        let per = io.shape.decode_block_tokens;
        let full = (req.prompt / per) as usize;
        let admitted: Vec<_> = req.blocks.iter().take(full).copied().collect();
        for block in admitted {
            io.emit(Event::Admitted { request: r, block });
        }
        io.emit(Event::FirstStep { request: r });
        self.requests[r as usize].decode = DecodeState::Decoding;
        Ok(())
    }

    fn abort(
        &mut self,
        io: &mut Io<'_>,
        r: RequestId,
        engine: Engine,
    ) -> Result<(), LifecycleError> {
        let req = &self.requests[r as usize];
        match engine {
            Engine::Prefill => match req.prefill {
                PrefillState::Pending if req.decode != DecodeState::Ended => {
                    self.requests[r as usize].prefill = PrefillState::Done;
                    io.proxy.push(ProxyMessage::Aborted { request: r });
                    Ok(())
                }
                // A computed request's blocks wait for decode's read or
                // the lease: decode may be reading them.
                _ => {
                    Self::ignore(io, format!("prefill holds nothing of r{r} it may drop"));
                    Ok(())
                }
            },
            Engine::Decode => match req.decode {
                DecodeState::Ended | DecodeState::Draining => {
                    Self::ignore(io, format!("r{r} has ended"));
                    Ok(())
                }
                DecodeState::Receiving => {
                    io.emit(Event::Ended {
                        request: r,
                        end: End::Aborted,
                    });
                    match self.policy.abort_in_flight {
                        AbortInFlight::HoldUntilLanded => {
                            self.requests[r as usize].decode = DecodeState::Draining;
                        }
                        AbortInFlight::FreeAtOnce => {
                            self.free_decode(io, r);
                            self.requests[r as usize].decode = DecodeState::Draining;
                        }
                    }
                    Ok(())
                }
                _ => {
                    if req.prefill == PrefillState::Pending {
                        self.requests[r as usize].prefill = PrefillState::Done;
                    }
                    self.end_on_decode(io, r, End::Aborted)
                }
            },
        }
    }

    fn fail_prefill(&mut self, io: &mut Io<'_>, r: RequestId) -> Result<(), LifecycleError> {
        let req = &self.requests[r as usize];
        if req.prefill != PrefillState::Pending || req.decode == DecodeState::Ended {
            Self::ignore(io, format!("r{r} is not on prefill"));
            return Ok(());
        }
        self.requests[r as usize].prefill = PrefillState::Done;
        io.emit(Event::PrefillFailed { request: r });
        if self.policy.failure_report == FailureReport::ToDecode {
            io.proxy.push(ProxyMessage::Failed { request: r });
        }
        Ok(())
    }

    fn finish(&mut self, io: &mut Io<'_>, r: RequestId, end: End) -> Result<(), LifecycleError> {
        match self.requests[r as usize].decode {
            DecodeState::Decoding | DecodeState::Received => self.end_on_decode(io, r, end),
            DecodeState::Receiving if end == End::Preempted => self.abort(io, r, Engine::Decode),
            _ => {
                Self::ignore(io, format!("r{r} is not decoding"));
                Ok(())
            }
        }
    }

    fn tick(&mut self, io: &mut Io<'_>, missed: bool) -> Result<(), LifecycleError> {
        // io.now has advanced already. Decode first: heartbeats, or a lease
        // it can no longer count on.
        for r in 0..self.requests.len() as u32 {
            let req = &self.requests[r as usize];
            let waiting = req.remote.is_some()
                && matches!(req.decode, DecodeState::Waiting | DecodeState::Allocated);
            let receiving = req.decode == DecodeState::Receiving;
            if !(waiting || receiving) {
                continue;
            }
            if !missed {
                self.notify_prefill(io, &format!("heartbeat:{r}"))?;
                let req = &mut self.requests[r as usize];
                req.deadline = req.deadline.max(io.now + HEARTBEAT_EXTENSION);
            } else if waiting
                && io.now >= req.deadline
                && self.policy.expired_lease == ExpiredLease::Fail
            {
                self.end_on_decode(io, r, End::Failed)?;
            }
        }
        self.progress_prefill(io)?;
        // Prefill reaps the leases that expired.
        for r in 0..self.requests.len() as u32 {
            if let PrefillState::Held { expiry, .. } = self.requests[r as usize].prefill {
                if io.now >= expiry {
                    io.emit(Event::LeaseReaped { request: r });
                    self.free_prefill(io, r);
                }
            }
        }
        Ok(())
    }

    fn progress_prefill(&mut self, io: &mut Io<'_>) -> Result<(), LifecycleError> {
        let Some((p, _)) = self.agents else {
            return Ok(());
        };
        for (_, message) in io.nixl.take_notifications(p)? {
            let text = String::from_utf8_lossy(&message);
            let Some((what, r)) = text.split_once(':') else {
                continue;
            };
            let Ok(r) = r.parse::<u32>() else { continue };
            if r as usize >= self.requests.len() {
                continue;
            }
            match what {
                "done" | "release" => self.free_prefill(io, r),
                "heartbeat" => {
                    if let PrefillState::Held { expiry, .. } =
                        &mut self.requests[r as usize].prefill
                    {
                        *expiry = (*expiry).max(io.now + HEARTBEAT_EXTENSION);
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn progress_decode(&mut self, io: &mut Io<'_>) -> Result<(), LifecycleError> {
        for message in std::mem::take(io.proxy) {
            match message {
                ProxyMessage::Ready {
                    request,
                    blocks,
                    state,
                } => {
                    let req = &mut self.requests[request as usize];
                    req.remote = Some((blocks, state));
                    req.deadline = io.now + LEASE_INTERVALS;
                    if req.decode == DecodeState::Ended {
                        // Aborted before prefill finished: let prefill go.
                        self.notify_prefill(io, &format!("release:{request}"))?;
                    }
                }
                ProxyMessage::Failed { request } | ProxyMessage::Aborted { request } => {
                    let end = if matches!(message, ProxyMessage::Failed { .. }) {
                        End::Failed
                    } else {
                        End::Aborted
                    };
                    self.requests[request as usize].doomed = Some(end);
                }
            }
        }
        let (_, d) = match self.agents {
            Some(a) => a,
            None => return Ok(()),
        };
        for r in 0..self.requests.len() as u32 {
            let req = &self.requests[r as usize];
            if let Some(end) = req.doomed {
                if matches!(req.decode, DecodeState::Waiting | DecodeState::Allocated) {
                    self.end_on_decode(io, r, end)?;
                    continue;
                }
            }
            let Some(x) = req.xfer else { continue };
            if !matches!(req.decode, DecodeState::Receiving | DecodeState::Draining) {
                continue;
            }
            let done = io.nixl.xfer_state(d, x)? == XferState::Done;
            let counts_done = done
                || (self.policy.completion_check == CompletionCheck::AnyPair
                    && req.decode == DecodeState::Receiving
                    && io
                        .nixl
                        .pending_pairs()
                        .iter()
                        .filter(|p| p.xfer == x)
                        .count()
                        < req.pairs_posted);
            if req.decode == DecodeState::Draining {
                if done {
                    io.nixl.release_xfer(d, x)?;
                    self.requests[r as usize].xfer = None;
                    self.free_decode(io, r);
                    self.requests[r as usize].decode = DecodeState::Ended;
                }
                continue;
            }
            if counts_done {
                if done {
                    io.nixl.release_xfer(d, x)?;
                    self.requests[r as usize].xfer = None;
                }
                self.receive(io, r)?;
            }
        }
        Ok(())
    }
}

impl LifecycleConnector for KvgeomLifecycle {
    fn start(&mut self, io: &mut Io<'_>) -> Result<(), LifecycleError> {
        io.nixl.defer_completion();
        let p = io.nixl.create_agent("prefill")?;
        let d = io.nixl.create_agent("decode")?;
        for (slot, (engine, agent)) in [(Engine::Prefill, p), (Engine::Decode, d)]
            .into_iter()
            .enumerate()
        {
            let arena = io.pools.arena(engine);
            let region = MemRegion {
                addr: arena.base(),
                len: arena.len(),
                mem: MemKind::Dram,
                dev: 0,
            };
            io.nixl.attach(arena.clone());
            io.nixl
                .register_memory(agent, std::slice::from_ref(&region))?;
            self.regions[slot] = vec![region];
        }
        self.agents = Some((p, d));
        Ok(())
    }

    fn apply(&mut self, op: &Operation, io: &mut Io<'_>) -> Result<(), LifecycleError> {
        if let Some(r) = op.request() {
            if r as usize >= self.requests.len() {
                Self::ignore(io, format!("r{r} was not submitted"));
                return Ok(());
            }
        }
        match *op {
            Operation::Submit {
                prompt,
                prefix_hit_blocks,
            } => {
                let r = self.requests.len() as u32;
                // The prefix cache never holds the block of the last token.
                let most = io
                    .shape
                    .blocks_for(Engine::Decode, prompt)
                    .saturating_sub(1);
                let hit = if io.shape.prefix_caching {
                    prefix_hit_blocks.min(most)
                } else {
                    0
                };
                io.emit(Event::Submitted {
                    request: r,
                    prompt,
                    prefix_hit_blocks: hit,
                });
                self.requests.push(Request {
                    prompt,
                    hit,
                    prefill: PrefillState::Pending,
                    decode: DecodeState::Waiting,
                    remote: None,
                    deadline: 0,
                    blocks: Vec::new(),
                    state: None,
                    xfer: None,
                    pairs_posted: 0,
                    doomed: None,
                });
                Ok(())
            }
            Operation::Compute { request } => self.compute(io, request),
            Operation::Allocate { request } => self.allocate(io, request),
            Operation::Post { request } => self.post(io, request),
            Operation::Step { request } => self.step(io, request),
            Operation::Finish { request } => self.finish(io, request, End::Finished),
            Operation::Preempt { request } => self.finish(io, request, End::Preempted),
            Operation::Abort { request, engine } => self.abort(io, request, engine),
            Operation::FailPrefill { request } => self.fail_prefill(io, request),
            Operation::Tick { missed } => self.tick(io, missed),
            // The runner lands pairs; the step loop sees them.
            Operation::Deliver { .. } => Ok(()),
        }
    }

    fn progress(&mut self, io: &mut Io<'_>) -> Result<(), LifecycleError> {
        self.progress_decode(io)?;
        self.progress_prefill(io)
    }

    fn next_operation(&self, r: RequestId) -> Option<Operation> {
        let req = self.requests.get(r as usize)?;
        let request = r;
        match req.decode {
            DecodeState::Ended | DecodeState::Draining | DecodeState::Receiving => None,
            DecodeState::Waiting => Some(if req.prefill == PrefillState::Pending {
                Operation::Compute { request }
            } else {
                Operation::Allocate { request }
            }),
            DecodeState::Allocated => Some(if req.prefill == PrefillState::Pending {
                Operation::Compute { request }
            } else {
                Operation::Post { request }
            }),
            DecodeState::Received => Some(Operation::Step { request }),
            DecodeState::Decoding => Some(Operation::Finish { request }),
        }
    }
}
