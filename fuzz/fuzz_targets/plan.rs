//! Arbitrary block-id lists through the request planner: no panic, and no
//! descriptor id outside the list it addresses.
#![no_main]

use kvgeom::generate::{targets, PlanInput};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: PlanInput| targets::plan(&input));
