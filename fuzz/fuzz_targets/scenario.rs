//! A generated P/D case through the connector and every oracle (see
//! `kvgeom::generate`). `KVGEOM_FUZZ_DEFECT=<name>` runs that defect variant
//! of the connector instead, so that a crash means the defect was found.
#![no_main]

use std::sync::LazyLock;

use kvgeom::defects::Defect;
use kvgeom::generate::{targets, GeneratedCase};
use libfuzzer_sys::fuzz_target;

static DEFECT: LazyLock<Option<Defect>> = LazyLock::new(|| {
    targets::defect_from_env().unwrap_or_else(|e| {
        eprintln!("error: {e}");
        std::process::exit(2)
    })
});

fuzz_target!(|case: GeneratedCase| targets::scenario(&case, *DEFECT));
