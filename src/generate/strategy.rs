//! proptest strategies over the same generators (cargo feature `proptest`):
//! raw bytes mapped through [`arbitrary::Arbitrary`], so proptest shrinks the
//! bytes and exhausted or zeroed bytes yield the smallest choices.

use proptest::collection::vec;
use proptest::prelude::*;

use super::{GeneratedCase, PlanInput};

/// Input bytes per drawn value; a case uses well under this.
pub const MAX_INPUT_BYTES: usize = 256;

fn bytes() -> impl Strategy<Value = Vec<u8>> {
    vec(any::<u8>(), 0..=MAX_INPUT_BYTES)
}

/// Generated scenarios (valid ones and the deliberately invalid ones).
pub fn generated_case() -> impl Strategy<Value = GeneratedCase> {
    bytes().prop_filter_map("bytes the generator cannot use", |b| {
        GeneratedCase::from_bytes(&b).ok()
    })
}

/// Block-id lists for the request planner.
pub fn plan_input() -> impl Strategy<Value = PlanInput> {
    bytes().prop_filter_map("bytes the generator cannot use", |b| {
        PlanInput::from_bytes(&b).ok()
    })
}
