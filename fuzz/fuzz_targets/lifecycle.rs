//! Lifecycle scenarios drawn from the fuzzer's bytes (the shape, then the
//! operations) through kvgeom's connector: no panic, and no lifecycle
//! oracle fires. `KVGEOM_FUZZ_LIFECYCLE_VARIANT=<name>` runs that variant
//! instead, so that a crash means the variant was found.
#![no_main]

use std::sync::LazyLock;

use kvgeom::lifecycle::fuzz_input::run_bytes;
use kvgeom::lifecycle::{KvgeomScenarios, LifecycleDefect};
use libfuzzer_sys::fuzz_target;

static CONNECTOR: LazyLock<KvgeomScenarios> = LazyLock::new(|| {
    match std::env::var("KVGEOM_FUZZ_LIFECYCLE_VARIANT") {
        Err(_) => KvgeomScenarios::new(None),
        Ok(name) => match LifecycleDefect::from_name(&name) {
            Some(d) => KvgeomScenarios::new(Some(d)),
            None => {
                eprintln!("error: KVGEOM_FUZZ_LIFECYCLE_VARIANT={name}: unknown lifecycle variant");
                std::process::exit(2)
            }
        },
    }
});

fuzz_target!(|data: &[u8]| {
    let (shape, scenario, run) = match run_bytes(data, &*CONNECTOR) {
        Ok(r) => r,
        Err(e) => panic!("harness error: {e}"),
    };
    assert!(
        !run.failed(),
        "{shape:?}\n{:?}\n{:?}",
        scenario.operations,
        run.findings
    );
});
