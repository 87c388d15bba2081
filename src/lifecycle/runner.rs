//! One scenario run: the operations applied in order to a connector over
//! fresh pools and the loopback (completion deferred), the engines' step
//! loop after each, then the drain that ends the scenario (pairs land,
//! each live request's next operation, a heartbeat interval, until every
//! request ended and every block is free, or the bound is reached), with
//! every oracle over every event.

use std::collections::HashMap;

use serde::Serialize;

use crate::nixl::Loopback;

use super::error::LifecycleError;
use super::operation::Operation;
use super::oracles::{self, Finding, Ledger, View};
use super::pools::Pools;
use super::record::{Event, PairSpan, Recorder, StepRecord};
use super::seam::{Io, LifecycleConnector, ProxyMessage};
use super::shape::LifecycleShape;

/// Rounds of the drain; more than a lease, so that every lease a
/// scenario leaves can expire and be reaped.
pub const DRAIN_ROUNDS: u32 = 12;

/// A scenario: its requests' operations on one geometry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Scenario {
    /// The seed it was drawn from.
    pub seed: u64,
    /// Requests the pools are sized for (submits beyond it are ignored).
    pub requests: u32,
    /// The operations.
    pub operations: Vec<Operation>,
}

/// What one run produced.
#[derive(Debug, Serialize)]
pub struct ScenarioRun {
    /// Every step, the drain's included.
    pub steps: Vec<StepRecord>,
    /// Every broken invariant.
    pub findings: Vec<Finding>,
}

impl ScenarioRun {
    /// Whether an oracle fired.
    pub fn failed(&self) -> bool {
        !self.findings.is_empty()
    }

    /// The oracles that fired, in the order they first did.
    pub fn oracles(&self) -> Vec<&'static str> {
        let mut v = Vec::new();
        for f in &self.findings {
            if !v.contains(&f.oracle) {
                v.push(f.oracle);
            }
        }
        v
    }
}

/// The world a connector runs in, and the oracles watching it.
struct World<'a> {
    shape: &'a LifecycleShape,
    pools: Pools,
    nixl: Loopback,
    proxy: Vec<ProxyMessage>,
    record: Recorder,
    now: u64,
    submitted: u32,
    requests: u32,
    transfers: HashMap<u64, Vec<PairSpan>>,
    ledger: Ledger,
    oracles: Vec<Box<dyn oracles::LifecycleOracle>>,
    checked: (usize, usize),
    findings: Vec<Finding>,
}

impl World<'_> {
    fn io(&mut self) -> Io<'_> {
        Io {
            shape: self.shape,
            pools: &mut self.pools,
            nixl: &mut self.nixl,
            proxy: &mut self.proxy,
            record: &mut self.record,
            now: self.now,
        }
    }

    /// Land one in-flight pair.
    fn land(&mut self, pick: u32) -> Result<(), LifecycleError> {
        let pending = self.nixl.pending_pairs();
        if pending.is_empty() {
            self.record.push(Event::Ignored {
                reason: "no pair in flight".into(),
            });
            return Ok(());
        }
        let p = pending[pick as usize % pending.len()];
        let pair = self
            .transfers
            .get(&p.xfer.0)
            .and_then(|pairs| pairs.get(p.pair))
            .copied()
            .ok_or_else(|| LifecycleError::Harness("a pair in flight was never posted".into()))?;
        self.nixl.deliver_pair(p.agent, p.xfer, p.pair)?;
        self.record.push(Event::Landed { pair });
        Ok(())
    }

    fn land_all(&mut self) -> Result<(), LifecycleError> {
        while !self.nixl.pending_pairs().is_empty() {
            self.land(0)?;
        }
        Ok(())
    }

    /// Run every oracle over the events recorded since the last check.
    fn check(&mut self) {
        let steps = &self.record.steps;
        while self.checked.0 < steps.len() {
            let (s, e) = self.checked;
            let step = &steps[s];
            if e >= step.events.len() {
                if s + 1 == steps.len() {
                    // More events may come in this step.
                    break;
                }
                self.checked = (s + 1, 0);
                continue;
            }
            let event = &step.events[e];
            if let Event::Posted {
                transfer, pairs, ..
            } = event
            {
                self.transfers.insert(*transfer, pairs.clone());
            }
            let view = View {
                shape: self.shape,
                pools: &self.pools,
                ledger: &self.ledger,
                step: s,
            };
            for o in &mut self.oracles {
                self.findings.extend(o.observe(event, &view));
            }
            self.ledger.apply(event);
            self.checked = (s, e + 1);
        }
    }

    fn step(
        &mut self,
        connector: &mut dyn LifecycleConnector,
        op: &Operation,
        drain: bool,
    ) -> Result<(), LifecycleError> {
        self.record.begin(op.to_string(), drain, self.now);
        match op {
            Operation::Deliver { pick } => self.land(*pick)?,
            Operation::Submit { .. } if self.submitted >= self.requests => {
                self.record.push(Event::Ignored {
                    reason: "the scenario's requests are all submitted".into(),
                });
            }
            Operation::Tick { .. } => {
                self.land_all()?;
                self.check();
                connector.progress(&mut self.io())?;
                self.now += 1;
                connector.apply(op, &mut self.io())?;
            }
            _ => {
                if matches!(op, Operation::Submit { .. }) {
                    self.submitted += 1;
                }
                self.check();
                connector.apply(op, &mut self.io())?;
            }
        }
        self.check();
        connector.progress(&mut self.io())?;
        if let Some(s) = self.record.steps.last_mut() {
            s.now = self.now;
        }
        self.check();
        Ok(())
    }

    fn settled(&self, connector: &dyn LifecycleConnector) -> bool {
        self.nixl.pending_pairs().is_empty()
            && (0..self.submitted).all(|r| connector.next_operation(r).is_none())
            && self.pools.ownership().iter().all(|(_, o)| o.is_none())
    }
}

/// Run `scenario` on `shape` through `connector`.
pub fn run_scenario(
    shape: &LifecycleShape,
    scenario: &Scenario,
    connector: &mut dyn LifecycleConnector,
) -> Result<ScenarioRun, LifecycleError> {
    let mut world = World {
        shape,
        pools: Pools::new(shape, scenario.requests.max(1)),
        nixl: Loopback::new(),
        proxy: Vec::new(),
        record: Recorder::default(),
        now: 0,
        submitted: 0,
        requests: scenario.requests.max(1),
        transfers: HashMap::new(),
        ledger: Ledger::default(),
        oracles: oracles::all(),
        checked: (0, 0),
        findings: Vec::new(),
    };
    connector.start(&mut world.io())?;
    for op in &scenario.operations {
        world.step(connector, op, false)?;
    }
    for _ in 0..DRAIN_ROUNDS {
        if world.settled(connector) {
            break;
        }
        world
            .record
            .begin("deliver every pair in flight".into(), true, world.now);
        world.land_all()?;
        world.check();
        connector.progress(&mut world.io())?;
        world.check();
        for r in 0..world.submitted {
            if let Some(op) = connector.next_operation(r) {
                world.step(connector, &op, true)?;
            }
        }
        world.step(connector, &Operation::Tick { missed: false }, true)?;
    }
    world.check();
    let view = View {
        shape,
        pools: &world.pools,
        ledger: &world.ledger,
        step: world.record.steps.len().saturating_sub(1),
    };
    let mut findings = world.findings;
    for o in &mut world.oracles {
        findings.extend(o.finish(&view));
    }
    Ok(ScenarioRun {
        steps: world.record.steps,
        findings,
    })
}
