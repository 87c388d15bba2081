//! Many scenarios: each geometry's scenarios drawn from one seed and run
//! through a connector ([`ScenarioConnector`]), the first failure of each
//! geometry shrunk; and the variants' runs of kvgeom's connector
//! (`kvgeom mutants`).

use serde::Serialize;

use super::error::LifecycleError;
use super::generator::{draw, scenario_seed, Seeded};
use super::oracles::Finding;
use super::runner::{Scenario, ScenarioRun};
use super::scenario_connector::{KvgeomScenarios, ScenarioConnector};
use super::shape::LifecycleShape;
use super::shrink::shrink;
use super::variants::LifecycleDefect;

/// How a geometry's scenarios are drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct SweepOptions {
    /// Scenarios per geometry.
    pub scenarios: u32,
    /// Requests per scenario.
    pub requests: u32,
    /// The run's seed.
    pub seed: u64,
}

/// A failing scenario, shrunk.
#[derive(Debug, Serialize)]
pub struct Failure {
    /// Its seed (what `--replay` takes).
    pub scenario_seed: u64,
    /// Operations before shrinking.
    pub operations: usize,
    /// The shrunk scenario.
    pub shrunk: Scenario,
    /// The shrunk run's findings.
    pub findings: Vec<Finding>,
}

/// One geometry's result.
#[derive(Debug, Serialize)]
pub struct GeometryResult {
    /// The geometry's name.
    pub geometry: String,
    /// Scenarios run.
    pub scenarios: u32,
    /// Scenarios an oracle failed.
    pub failed: u32,
    /// Operations run (the drain's steps included).
    pub operations: u64,
    /// Each oracle that fired and on how many scenarios.
    pub oracles: Vec<(String, u32)>,
    /// The first failure, shrunk.
    pub first_failure: Option<Failure>,
}

/// Scenario `seed` of `shape`, drawn.
pub fn scenario(shape: &LifecycleShape, requests: u32, seed: u64) -> Scenario {
    draw(shape, requests, seed, &mut Seeded(seed))
}

/// `scenario` shrunk while the oracle that fired first on it still fires.
pub fn shrink_failure(
    shape: &LifecycleShape,
    scenario: &Scenario,
    connector: &dyn ScenarioConnector,
    oracle: &str,
) -> Result<(Scenario, ScenarioRun), LifecycleError> {
    let small = shrink(scenario, |s| {
        Ok(connector
            .run(shape, s)?
            .findings
            .iter()
            .any(|f| f.oracle == oracle))
    })?;
    let run = connector.run(shape, &small)?;
    Ok((small, run))
}

/// Every scenario of `shape`; `stop_at_first` ends at the first failure
/// (the variants' runs).
pub fn sweep_geometry(
    shape: &LifecycleShape,
    opts: &SweepOptions,
    connector: &dyn ScenarioConnector,
    stop_at_first: bool,
    mut progress: impl FnMut(),
) -> Result<GeometryResult, LifecycleError> {
    let mut result = GeometryResult {
        geometry: shape.name.clone(),
        scenarios: 0,
        failed: 0,
        operations: 0,
        oracles: Vec::new(),
        first_failure: None,
    };
    for index in 0..opts.scenarios {
        let seed = scenario_seed(opts.seed, &shape.name, index);
        let s = scenario(shape, opts.requests, seed);
        let r = connector.run(shape, &s)?;
        progress();
        result.scenarios += 1;
        result.operations += r.steps.len() as u64;
        if !r.failed() {
            continue;
        }
        result.failed += 1;
        for o in r.oracles() {
            match result.oracles.iter_mut().find(|(n, _)| n == o) {
                Some((_, n)) => *n += 1,
                None => result.oracles.push((o.to_string(), 1)),
            }
        }
        if result.first_failure.is_none() {
            let (shrunk, small) = shrink_failure(shape, &s, connector, r.findings[0].oracle)?;
            result.first_failure = Some(Failure {
                scenario_seed: seed,
                operations: s.operations.len(),
                shrunk,
                findings: small.findings,
            });
        }
        if stop_at_first {
            break;
        }
    }
    Ok(result)
}

/// One variant over every shape: caught where a scenario fails.
#[derive(Debug, Serialize)]
pub struct VariantResult {
    /// The variant's name.
    pub variant: &'static str,
    /// The report it cites.
    pub cites: &'static str,
    /// Scenarios run.
    pub scenarios: u32,
    /// The oracles that fired on its first failing geometry.
    pub oracles: Vec<String>,
    /// The geometry and scenario seed that caught it.
    pub caught_by: Option<(String, u64)>,
    /// The file of that geometry, when the caller knows it.
    pub file: Option<String>,
}

/// Run kvgeom's connector with `defect` on each shape, `opts.scenarios` scenarios each, until one fails.
pub fn run_variant(
    shapes: &[LifecycleShape],
    opts: &SweepOptions,
    defect: LifecycleDefect,
) -> Result<VariantResult, LifecycleError> {
    let mut out = VariantResult {
        variant: defect.name(),
        cites: defect.row().cites,
        scenarios: 0,
        oracles: Vec::new(),
        caught_by: None,
        file: None,
    };
    let connector = KvgeomScenarios::new(Some(defect));
    for shape in shapes {
        let g = sweep_geometry(shape, opts, &connector, true, || {})?;
        out.scenarios += g.scenarios;
        if let Some(f) = g.first_failure {
            out.oracles = g.oracles.into_iter().map(|(o, _)| o).collect();
            out.caught_by = Some((g.geometry, f.scenario_seed));
            break;
        }
    }
    Ok(out)
}
