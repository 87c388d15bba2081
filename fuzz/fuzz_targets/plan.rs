//! Arbitrary requests through the connector's request planner (the function
//! pull and push call): no panic, no descriptor id outside the list it
//! addresses, and every attention pair token-aligned.
//! `KVGEOM_FUZZ_DEFECT=<name>` plans with that defect variant instead, so
//! that a crash means the defect was found.
#![no_main]

use std::sync::LazyLock;

use kvgeom::defects::Defect;
use kvgeom::generate::{targets, PlanInput};
use libfuzzer_sys::fuzz_target;

static DEFECT: LazyLock<Option<Defect>> = LazyLock::new(|| {
    targets::defect_from_env().unwrap_or_else(|e| {
        eprintln!("error: {e}");
        std::process::exit(2)
    })
});

fuzz_target!(|input: PlanInput| targets::plan(&input, *DEFECT));
