//! The replay command of a live case (its shrinking is
//! `sweep::batch_shrink`).

use crate::scenario::Case;
use crate::variant::Variant;

/// The command that replays `case` on vLLM's connector.
pub fn live_replay_command(case: &Case) -> String {
    let mut plain = case.clone();
    plain.variant = Variant::default();
    format!("{} --connector vllm", plain.replay_command())
}
