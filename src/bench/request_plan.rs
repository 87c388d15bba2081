//! One pulled request's transfers as the connector plans them, detached
//! from the memory they were planned on, so a benchmark can replay them on
//! any memory: every KV tensor of both engines becomes a numbered buffer,
//! every posted READ keeps its descriptor lists (as rows of buffer +
//! offset + length) and its desc ids.
//!
//! Planning registers host arenas that are never touched (their zeroed
//! pages are never faulted in) with the [`DryRun`] transport, so even a
//! geometry with gigabytes of KV memory plans in milliseconds. The plan
//! itself holds one row per descriptor of every posted list (a whole pool's
//! worth, as vLLM prepares them): those bytes are counted and held to the
//! memory budget before any row is written.

use crate::connector::{ConnectorError, HandshakeError, Policy};
use crate::geometry::{Geometry, Mode};
use crate::layout::Side;
use crate::nixl::{DescRow, DryRun, Recording};
use crate::scenario::engines::{register_side, unbacked_ranks, Engines};
use crate::scenario::memory_estimate::{process_budget, Budget, OverBudget};
use crate::scenario::placement::{place, PlacementError};
use crate::scenario::run::read_request;
use crate::scenario::Outcome;
use crate::scheduler::{request_shape, DecodeAllocation};

/// One KV tensor of one rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufferSpec {
    pub side: Side,
    pub rank: u32,
    pub region: u32,
    pub len: u64,
}

/// One descriptor: `len` bytes at `offset` of buffer `buffer`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Row {
    pub buffer: usize,
    pub offset: u64,
    pub len: u64,
}

/// One READ of the request: the initiator's local list and ids, the
/// remote list (prepared against `remote_rank` of the other side) and ids.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedXfer {
    pub initiator_rank: u32,
    pub remote_rank: u32,
    pub local: Vec<Row>,
    pub local_ids: Vec<u32>,
    pub remote: Vec<Row>,
    pub remote_ids: Vec<u32>,
}

impl PlannedXfer {
    /// `(local row, remote row)` of every pair.
    pub fn pairs(&self) -> impl Iterator<Item = (Row, Row)> + '_ {
        self.local_ids
            .iter()
            .zip(&self.remote_ids)
            .map(|(&l, &r)| (self.local[l as usize], self.remote[r as usize]))
    }
}

/// Everything a replay needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestPlan {
    pub geometry: String,
    pub prompt_len: u32,
    pub buffers: Vec<BufferSpec>,
    /// Decode's READs, each initiated by a decode rank against a prefill rank.
    pub xfers: Vec<PlannedXfer>,
}

impl RequestPlan {
    /// Bytes one replay moves.
    pub fn bytes(&self) -> u64 {
        self.xfers
            .iter()
            .flat_map(|x| x.pairs())
            .map(|(l, _)| l.len)
            .sum()
    }

    /// Bytes the plan's rows hold (and as much again while a replay turns
    /// them into descriptor lists).
    pub fn held_bytes(&self) -> u64 {
        let rows: u64 = self
            .xfers
            .iter()
            .map(|x| (x.local.len() + x.remote.len()) as u64)
            .sum();
        rows.saturating_mul(ROW_BYTES)
    }

    /// Descriptor pairs one replay moves.
    pub fn pairs(&self) -> u64 {
        self.xfers.iter().map(|x| x.local_ids.len() as u64).sum()
    }

    /// Indexes of the buffers of one side, in plan order.
    pub fn buffers_of(&self, side: Side) -> impl Iterator<Item = usize> + '_ {
        self.buffers
            .iter()
            .enumerate()
            .filter(move |(_, b)| b.side == side)
            .map(|(i, _)| i)
    }

    /// Ranks of one side.
    pub fn ranks(&self, side: Side) -> Vec<u32> {
        let mut ranks: Vec<u32> = self
            .buffers
            .iter()
            .filter(|b| b.side == side)
            .map(|b| b.rank)
            .collect();
        ranks.dedup();
        ranks
    }
}

/// Bytes one planned descriptor takes: its row in the plan, and its row in
/// the descriptor list a replay builds from it.
const ROW_BYTES: u64 = (std::mem::size_of::<Row>() + std::mem::size_of::<DescRow>()) as u64;

/// Why a request cannot be planned: the geometry, the prompt length and
/// the typed cause.
#[derive(Debug, thiserror::Error)]
#[error("cannot plan a {prompt_len}-token request of {geometry}: {cause}")]
pub struct PlanError {
    /// The geometry's name.
    pub geometry: String,
    /// The request's prompt length.
    pub prompt_len: u32,
    /// What stopped the plan.
    #[source]
    pub cause: PlanCause,
}

/// What stopped a request's plan.
#[derive(Debug, thiserror::Error)]
pub enum PlanCause {
    /// The request's blocks do not fit an engine's pool.
    #[error(transparent)]
    Placement(#[from] PlacementError),
    /// An engine's ranks could not be configured or registered.
    #[error("{}", .0.describe())]
    Registration(Outcome),
    /// A decode rank found no prefill ranks to handshake with.
    #[error(transparent)]
    Handshake(#[from] HandshakeError),
    /// The connector refused the handshake or the READs.
    #[error(transparent)]
    Connector(#[from] ConnectorError),
    /// A planned descriptor lies outside every KV tensor.
    #[error("descriptor {addr:#x}+{len} lies in no KV tensor")]
    OutsideTensors {
        /// The descriptor's address.
        addr: u64,
        /// Its length in bytes.
        len: u64,
    },
    /// The plan's descriptor rows need more memory than the budget.
    #[error(transparent)]
    OverBudget(Box<OverBudget>),
    /// A transfer names an agent that is no engine rank.
    #[error("unexpected agent {name:?}")]
    UnexpectedAgent {
        /// The agent's name, if the transport knows it.
        name: Option<String>,
    },
}

/// Plan the pull of one `prompt_len`-token request (no prefix hit, block
/// placement from seed 0) through the connector, within this process's
/// budget ([`process_budget`]).
pub fn plan_request(geometry: &Geometry, prompt_len: u32) -> Result<RequestPlan, PlanError> {
    plan_request_within(geometry, prompt_len, &process_budget())
}

/// [`plan_request`] within `budget`: the rows of the posted lists are
/// counted first, and a plan whose rows do not fit is
/// [`PlanCause::OverBudget`], before any is written.
pub fn plan_request_within(
    geometry: &Geometry,
    prompt_len: u32,
    budget: &Budget,
) -> Result<RequestPlan, PlanError> {
    let fail = |cause: PlanCause| PlanError {
        geometry: geometry.name.clone(),
        prompt_len,
        cause,
    };
    let connector = |e: ConnectorError| fail(e.into());
    let shape = request_shape(geometry, prompt_len, 0, DecodeAllocation::Mainline);
    let placement = place(geometry, &shape, 0).map_err(|e| fail(e.into()))?;
    // The dry run moves no bytes: the ranks' arenas are addresses only.
    let (p_arenas, d_arenas) = unbacked_ranks(geometry, &placement);
    let mut buffers = Vec::new();
    let mut bases = Vec::new();
    for (side, ranks) in [(Side::Prefill, &p_arenas), (Side::Decode, &d_arenas)] {
        for (rank, arenas) in ranks.iter().enumerate() {
            for (region, a) in arenas.iter().enumerate() {
                buffers.push(BufferSpec {
                    side,
                    rank: rank as u32,
                    region: region as u32,
                    len: a.len(),
                });
                bases.push(a.base());
            }
        }
    }
    let mut nixl = Recording::new(DryRun::new());
    let outcome = |o: Outcome| fail(PlanCause::Registration(o));
    let prefill = register_side(
        &mut nixl,
        geometry,
        Side::Prefill,
        Mode::Pull,
        placement.prefill_pool,
        p_arenas,
        Policy::default(),
    )
    .map_err(outcome)?;
    let decode = register_side(
        &mut nixl,
        geometry,
        Side::Decode,
        Mode::Pull,
        placement.decode_pool,
        d_arenas,
        Policy::default(),
    )
    .map_err(outcome)?;
    let mut engines = Engines { prefill, decode };
    let blocks = placement.request_blocks(geometry, 0);
    let p_tp = geometry.prefill.tp_size;
    for d in 0..engines.decode.len() {
        let targets = engines.decode[d]
            .worker
            .handshake_targets(p_tp)
            .map_err(|e| fail(e.into()))?;
        for target in targets {
            let meta = engines.prefill[target as usize]
                .worker
                .metadata(&mut nixl)
                .map_err(connector)?;
            engines.decode[d]
                .worker
                .add_remote_agent(&mut nixl, &meta, target, p_tp)
                .map_err(connector)?;
        }
        let req = read_request(&blocks, p_tp, Vec::new(), None);
        engines.decode[d]
            .worker
            .start_read(&mut nixl, &req)
            .map_err(connector)?;
    }
    let locate = |row: DescRow| -> Result<Row, PlanError> {
        buffers
            .iter()
            .zip(&bases)
            .position(|(b, &base)| row.addr >= base && row.end() <= base + b.len)
            .map(|buffer| Row {
                buffer,
                offset: row.addr - bases[buffer],
                len: row.len,
            })
            .ok_or_else(|| {
                fail(PlanCause::OutsideTensors {
                    addr: row.addr,
                    len: row.len,
                })
            })
    };
    let posted: Vec<_> = nixl.xfers().into_iter().filter(|x| x.posted).collect();
    let rows = posted.iter().fold(0u64, |a, x| {
        a.saturating_add(x.local_list.len())
            .saturating_add(x.remote_list.len())
    });
    budget
        .check(
            &format!("its {rows} descriptor rows"),
            rows.saturating_mul(ROW_BYTES),
            "use a larger kernel block, fewer layer slots or a smaller pool (num_logical_blocks)",
        )
        .map_err(|e| fail(PlanCause::OverBudget(Box::new(e))))?;
    let mut xfers = Vec::new();
    for x in posted {
        let rank_of = |name: Option<&str>| match name.and_then(Side::parse_agent_name) {
            Some((_, rank)) => Ok(rank),
            None => Err(fail(PlanCause::UnexpectedAgent {
                name: name.map(str::to_string),
            })),
        };
        xfers.push(PlannedXfer {
            initiator_rank: rank_of(nixl.name_of(x.agent))?,
            remote_rank: rank_of(Some(x.remote_agent))?,
            local: x.local_list.rows().map(locate).collect::<Result<_, _>>()?,
            local_ids: x.local_ids.to_vec(),
            remote: x.remote_list.rows().map(locate).collect::<Result<_, _>>()?,
            remote_ids: x.remote_ids.to_vec(),
        });
    }
    Ok(RequestPlan {
        geometry: geometry.name.clone(),
        prompt_len,
        buffers,
        xfers,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::geometry::load_geometry;
    use crate::scenario::{Case, RunOptions};
    use crate::under_test::run_case_detailed;
    use std::path::Path;
    use std::sync::Arc;

    fn geometry(name: &str) -> Geometry {
        load_geometry(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("geometries")
                .join(format!("{name}.toml")),
        )
        .unwrap()
    }

    #[test]
    fn the_plan_moves_what_the_scenario_moves() {
        let g = geometry("g1-mla-kda-ppl3-vs-2");
        let plan = plan_request(&g, 29).unwrap();
        // P TP2 and D TP1, two layer slots each.
        let sides: Vec<(Side, u32, u32)> = plan
            .buffers
            .iter()
            .map(|b| (b.side, b.rank, b.region))
            .collect();
        assert_eq!(
            sides,
            [
                (Side::Prefill, 0, 0),
                (Side::Prefill, 0, 1),
                (Side::Prefill, 1, 0),
                (Side::Prefill, 1, 1),
                (Side::Decode, 0, 0),
                (Side::Decode, 0, 1),
            ]
        );
        assert_eq!(plan.ranks(Side::Prefill), [0, 1]);
        // Every pair reads prefill memory into decode memory.
        for x in &plan.xfers {
            for (l, r) in x.pairs() {
                assert_eq!(plan.buffers[l.buffer].side, Side::Decode);
                assert_eq!(plan.buffers[r.buffer].side, Side::Prefill);
                assert_eq!(plan.buffers[r.buffer].rank, x.remote_rank);
            }
        }
        // The same case through the scenario posts the same pairs and bytes.
        let case = Case {
            geometry: Arc::new(g),
            file: None,
            prompt_len: 29,
            prefix_hit: 0,
            mode: Mode::Pull,
            allocation: DecodeAllocation::Mainline,
            seed: 0,
            variant: crate::variant::Variant::KVGEOM,
        };
        let run = run_case_detailed(&case, &RunOptions::default());
        assert!(run.report.passed(), "{:?}", run.report.outcome);
        assert_eq!(plan.pairs(), run.report.stats.pairs);
        assert_eq!(plan.bytes(), run.report.stats.transferred_bytes);
    }

    #[test]
    fn a_refused_pair_is_a_plan_error() {
        let g = geometry("reject-g1-prefix-caching");
        let e = plan_request(&g, 29).unwrap_err();
        assert!(
            matches!(e.cause, PlanCause::Connector(_)),
            "the refusal is the connector's, typed: {e:?}"
        );
        assert!(
            e.to_string()
                .starts_with("cannot plan a 29-token request of reject-g1-prefix-caching: "),
            "{e}"
        );
    }
}
