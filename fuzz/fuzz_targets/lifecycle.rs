//! Lifecycle scenarios drawn from the fuzzer's bytes (the shape, then the
//! operations) through kvgeom's connector: no panic, and no lifecycle
//! oracle fires. `KVGEOM_FUZZ_LIFECYCLE_VARIANT=<name>` runs that variant
//! instead, so that a crash means the variant was found.
#![no_main]

use std::sync::LazyLock;

use kvgeom::lifecycle::fuzz_input::run_bytes;
use kvgeom::lifecycle::{LifecycleDefect, LifecyclePolicy};
use libfuzzer_sys::fuzz_target;

static POLICY: LazyLock<LifecyclePolicy> = LazyLock::new(|| {
    match std::env::var("KVGEOM_FUZZ_LIFECYCLE_VARIANT") {
        Err(_) => LifecyclePolicy::default(),
        Ok(name) => match LifecycleDefect::from_name(&name) {
            Some(d) => d.policy(),
            None => {
                eprintln!("error: KVGEOM_FUZZ_LIFECYCLE_VARIANT={name}: unknown lifecycle variant");
                std::process::exit(2)
            }
        },
    }
});

fuzz_target!(|data: &[u8]| {
    let (shape, scenario, run) = match run_bytes(data, *POLICY) {
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
