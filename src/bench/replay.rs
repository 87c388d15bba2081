//! Replaying a [`RequestPlan`] through any [`Nixl`] transport: one agent
//! per rank this process owns (named as the connector names them), its
//! buffers registered, the connector's descriptor lists prepared with the
//! buffers' real addresses, one prepared transfer per planned READ (or the
//! same lists and ids as a WRITE), then every transfer posted together and
//! waited for, as many times as asked.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::layout::Side;
use crate::nixl::{
    AgentId, DescList, DescRow, DlistTarget, MemKind, Nixl, NixlError, XferHandle, XferOp,
    XferState,
};

use crate::time_limits::TimeLimitError;

use super::buffers::BenchMemory;
use super::request_plan::{RequestPlan, Row};

/// Why a replay failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReplayError {
    /// The transport refused a call.
    #[error("{0}")]
    Nixl(#[from] NixlError),
    /// An iteration waited longer than its stall limit
    /// ([`crate::time_limits::stall_limit`]).
    #[error(
        "hung: {pending} of {total} transfers still in progress after {} (iteration {iteration}; \
         limit {})",
        crate::time_limits::seconds_text(*limit),
        crate::time_limits::setting_text(crate::time_limits::STALL_LIMIT_VAR, *limit)
    )]
    Stalled {
        /// The iteration, from 1.
        iteration: u32,
        /// Transfers still in progress.
        pending: usize,
        /// Transfers posted.
        total: usize,
        /// The stall limit.
        limit: Duration,
    },
    /// The stall limit's environment variable is unusable.
    #[error(transparent)]
    TimeLimit(#[from] TimeLimitError),
    /// A planned row's buffer has no address in this process or the peer.
    #[error("no address for buffer {buffer}")]
    NoAddress {
        /// The buffer, by plan number.
        buffer: usize,
    },
    /// A planned READ's initiator has no agent in this process.
    #[error("no agent for decode rank {rank}")]
    NoAgent {
        /// The decode rank.
        rank: u32,
    },
}

/// The agents of the ranks this process owns.
pub type Agents = BTreeMap<(Side, u32), AgentId>;

/// Create an agent for every rank of `sides` and register its buffers.
pub fn create_agents<T: Nixl + ?Sized>(
    t: &mut T,
    plan: &RequestPlan,
    memory: &BenchMemory,
    sides: &[Side],
) -> Result<Agents, ReplayError> {
    let mut agents = Agents::new();
    for &side in sides {
        for rank in plan.ranks(side) {
            let agent = t.create_agent(&side.agent_name(rank))?;
            let regions: Vec<_> = memory
                .owned(plan, side)
                .filter(|(i, _)| plan.buffers[*i].rank == rank)
                .map(|(_, b)| b.region())
                .collect();
            t.register_memory(agent, &regions)?;
            agents.insert((side, rank), agent);
        }
    }
    Ok(agents)
}

/// Let every decode agent know every prefill agent and the other way round
/// (both live in this process).
pub fn connect_in_process<T: Nixl + ?Sized>(t: &mut T, agents: &Agents) -> Result<(), ReplayError> {
    let of = |side: Side| -> Vec<AgentId> {
        agents
            .iter()
            .filter(|((s, _), _)| *s == side)
            .map(|(_, &a)| a)
            .collect()
    };
    for (from, to) in [(Side::Prefill, Side::Decode), (Side::Decode, Side::Prefill)] {
        for &source in &of(from) {
            let md = t.local_metadata(source)?;
            for &target in &of(to) {
                t.add_remote_agent(target, &md)?;
            }
        }
    }
    Ok(())
}

fn list(
    rows: &[Row],
    address: &dyn Fn(usize) -> Option<u64>,
    dev: u32,
) -> Result<DescList, ReplayError> {
    let rows = rows
        .iter()
        .map(|r| {
            address(r.buffer)
                .map(|base| DescRow {
                    addr: base + r.offset,
                    len: r.len,
                    dev,
                })
                .ok_or(ReplayError::NoAddress { buffer: r.buffer })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(DescList::from_rows(rows))
}

/// Prepare the plan's lists and make one transfer per planned READ, each
/// initiated by its decode agent. `address` gives each buffer's address
/// (this process's or a peer's).
pub fn prepare_transfers<T: Nixl + ?Sized>(
    t: &mut T,
    plan: &RequestPlan,
    agents: &Agents,
    address: &dyn Fn(usize) -> Option<u64>,
    mem: MemKind,
    dev: u32,
    op: XferOp,
) -> Result<Vec<(AgentId, XferHandle)>, ReplayError> {
    let mut xfers = Vec::with_capacity(plan.xfers.len());
    for x in &plan.xfers {
        let agent = *agents
            .get(&(Side::Decode, x.initiator_rank))
            .ok_or(ReplayError::NoAgent {
                rank: x.initiator_rank,
            })?;
        let local = t.prepare_dlist(
            agent,
            &DlistTarget::Local,
            mem,
            &list(&x.local, address, dev)?,
        )?;
        let remote = t.prepare_dlist(
            agent,
            &DlistTarget::Remote(Side::Prefill.agent_name(x.remote_rank)),
            mem,
            &list(&x.remote, address, dev)?,
        )?;
        let xfer = t.make_xfer(agent, op, local, &x.local_ids, remote, &x.remote_ids, None)?;
        xfers.push((agent, xfer));
    }
    Ok(xfers)
}

/// Post every transfer, then wait for all; `iterations` times, calling
/// `before_each` (untimed) first. Returns each iteration's wall time. An
/// iteration that takes longer than the stall limit
/// ([`crate::time_limits::stall_limit`]) fails with [`ReplayError::Stalled`].
/// Errors are the caller's type `E`: `before_each`'s own, or a
/// [`ReplayError`] converted.
pub fn time_transfers<T: Nixl + ?Sized, E: From<ReplayError>>(
    t: &mut T,
    xfers: &[(AgentId, XferHandle)],
    iterations: u32,
    before_each: &mut dyn FnMut() -> Result<(), E>,
) -> Result<Vec<Duration>, E> {
    let limit = crate::time_limits::stall_limit().map_err(ReplayError::from)?;
    time_transfers_within(t, xfers, iterations, limit, before_each)
}

/// As [`time_transfers`], with an explicit stall limit.
pub fn time_transfers_within<T: Nixl + ?Sized, E: From<ReplayError>>(
    t: &mut T,
    xfers: &[(AgentId, XferHandle)],
    iterations: u32,
    limit: Duration,
    before_each: &mut dyn FnMut() -> Result<(), E>,
) -> Result<Vec<Duration>, E> {
    let nixl = |e: NixlError| E::from(ReplayError::Nixl(e));
    let mut times = Vec::with_capacity(iterations as usize);
    for iteration in 1..=iterations {
        before_each()?;
        let start = Instant::now();
        let mut pending = Vec::new();
        for &(agent, xfer) in xfers {
            if t.post_xfer(agent, xfer).map_err(nixl)? == XferState::InProgress {
                pending.push((agent, xfer));
            }
        }
        while !pending.is_empty() {
            if start.elapsed() > limit {
                return Err(ReplayError::Stalled {
                    iteration,
                    pending: pending.len(),
                    total: xfers.len(),
                    limit,
                }
                .into());
            }
            let mut still = Vec::with_capacity(pending.len());
            for (agent, xfer) in pending {
                if t.xfer_state(agent, xfer).map_err(nixl)? == XferState::InProgress {
                    still.push((agent, xfer));
                }
            }
            pending = still;
        }
        times.push(start.elapsed());
    }
    Ok(times)
}
