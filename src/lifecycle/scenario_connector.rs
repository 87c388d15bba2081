//! A connector as the lifecycle sweep sees it: something that runs a
//! scenario (a batch of requests on one P/D pair whose engines share their
//! block pools) and returns its record judged by the lifecycle oracles.
//! The one pipeline's connectors hand one out
//! (`cli::pipeline::PipelineConnector::lifecycle`); kvgeom's runs each
//! scenario in process through [`KvgeomLifecycle`] over the seam of
//! `seam.rs`. A connector driven in another process would return the same
//! record from its driver's log.

use super::error::LifecycleError;
use super::kvgeom_connector::KvgeomLifecycle;
use super::policy::LifecyclePolicy;
use super::runner::{run_scenario, Scenario, ScenarioRun};
use super::shape::LifecycleShape;
use super::variants::LifecycleDefect;

/// A connector that runs lifecycle scenarios. `Sync`: the sweep runs
/// geometries in parallel over one connector.
pub trait ScenarioConnector: Sync {
    /// The connector's name as reports print it ("kvgeom").
    fn name(&self) -> &'static str;
    /// The lifecycle defect variant it runs, if any.
    fn variant(&self) -> Option<LifecycleDefect>;
    /// Run `scenario` of `shape` on fresh pools, every lifecycle oracle
    /// over every event.
    fn run(
        &self,
        shape: &LifecycleShape,
        scenario: &Scenario,
    ) -> Result<ScenarioRun, LifecycleError>;
}

/// kvgeom's connector, whole or with one lifecycle defect variant.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KvgeomScenarios {
    variant: Option<LifecycleDefect>,
}

impl KvgeomScenarios {
    /// kvgeom's connector with `variant` (none: the connector itself).
    pub fn new(variant: Option<LifecycleDefect>) -> Self {
        KvgeomScenarios { variant }
    }

    fn policy(&self) -> LifecyclePolicy {
        self.variant
            .map_or_else(LifecyclePolicy::default, LifecycleDefect::policy)
    }
}

impl ScenarioConnector for KvgeomScenarios {
    fn name(&self) -> &'static str {
        "kvgeom"
    }

    fn variant(&self) -> Option<LifecycleDefect> {
        self.variant
    }

    fn run(
        &self,
        shape: &LifecycleShape,
        scenario: &Scenario,
    ) -> Result<ScenarioRun, LifecycleError> {
        run_scenario(shape, scenario, &mut KvgeomLifecycle::new(self.policy()))
    }
}
