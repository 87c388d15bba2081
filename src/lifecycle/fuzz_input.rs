//! A lifecycle scenario from raw bytes, for the cargo-fuzz target
//! (`fuzz/fuzz_targets/lifecycle.rs`): the first bytes choose the shape
//! (each engine's tokens per block, mamba state, prefix caching, the
//! prompt lengths, the requests), the rest draw the operations.

use super::error::LifecycleError;
use super::generator::{draw, Bytes, Entropy};
use super::runner::{Scenario, ScenarioRun};
use super::scenario_connector::ScenarioConnector;
use super::shape::LifecycleShape;

/// The shape, the scenario and `connector`'s run of it.
pub fn run_bytes(
    data: &[u8],
    connector: &dyn ScenarioConnector,
) -> Result<(LifecycleShape, Scenario, ScenarioRun), LifecycleError> {
    let mut e = Bytes(data);
    let prefill_block_tokens = 1 + e.below(16);
    let decode_block_tokens = 1 + e.below(32);
    let has_state = e.below(2) == 1;
    let prefix_caching = e.below(2) == 1;
    let prompts: Vec<u32> = (0..1 + e.below(4)).map(|_| 1 + e.below(96)).collect();
    let requests = 1 + e.below(6);
    let shape = LifecycleShape {
        name: "fuzz".into(),
        prefill_block_tokens,
        decode_block_tokens,
        has_state,
        prompts,
        prefix_caching,
    };
    let scenario = draw(&shape, requests, 0, &mut e);
    let result = connector.run(&shape, &scenario)?;
    Ok((shape, scenario, result))
}
