//! Properties of the lifecycle as a whole: kvgeom's connector passes every
//! scenario drawn, runs are deterministic, every variant is caught and
//! every oracle fails on some variant, failures shrink to a few
//! operations, and byte-drawn scenarios (the fuzz target's) run.

use proptest::prelude::*;

use super::fuzz_input::run_bytes;
use super::oracles::ORACLE_NAMES;
use super::sweep::{scenario, shrink_failure, sweep_geometry, SweepOptions};
use super::{KvgeomScenarios, LifecycleDefect, LifecycleShape, ScenarioConnector};

/// kvgeom's connector, or one of its lifecycle variants.
fn kvgeom(variant: Option<LifecycleDefect>) -> KvgeomScenarios {
    KvgeomScenarios::new(variant)
}

fn shape(p: u32, d: u32, has_state: bool, prefix_caching: bool) -> LifecycleShape {
    LifecycleShape {
        name: format!("p{p}-d{d}"),
        prefill_block_tokens: p,
        decode_block_tokens: d,
        has_state,
        prompts: vec![1, p.max(d) - 1, p.max(d) + 1, 2 * p.max(d) + 3],
        prefix_caching,
    }
}

/// A KimiLinear-like pair: prefill blocks of 8 tokens, decode of 24, a
/// mamba state, decode's prefix cache on.
fn hybrid() -> LifecycleShape {
    shape(8, 24, true, true)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn kvgeom_passes_every_scenario(
        seed in any::<u64>(),
        p in 1u32..20,
        d in 1u32..40,
        has_state: bool,
        prefix_caching: bool,
        requests in 1u32..6,
    ) {
        let s = shape(p, d, has_state, prefix_caching);
        let sc = scenario(&s, requests, seed);
        let r = kvgeom(None).run(&s, &sc).unwrap();
        prop_assert!(!r.failed(), "{:?}\n{}", r.findings, super::timeline::render(&r));
    }

    #[test]
    fn byte_drawn_scenarios_run_and_pass(data in proptest::collection::vec(any::<u8>(), 0..400)) {
        let (_, _, r) = run_bytes(&data, &kvgeom(None)).unwrap();
        prop_assert!(!r.failed(), "{:?}", r.findings);
    }
}

#[test]
fn a_seed_gives_the_same_run() {
    let s = hybrid();
    for seed in 0..20 {
        let connector = kvgeom(Some(LifecycleDefect::ReadAfterLeaseReaped));
        let a = connector.run(&s, &scenario(&s, 4, seed)).unwrap();
        let b = connector.run(&s, &scenario(&s, 4, seed)).unwrap();
        assert_eq!(
            serde_json::to_string(&a).unwrap(),
            serde_json::to_string(&b).unwrap()
        );
    }
}

#[test]
fn every_variant_is_caught_and_every_oracle_fails_on_one() {
    let opts = SweepOptions {
        scenarios: 300,
        requests: 4,
        seed: 0,
    };
    let mut fired = std::collections::BTreeSet::new();
    for d in LifecycleDefect::ALL {
        let g = sweep_geometry(&hybrid(), &opts, &kvgeom(Some(d)), false, || {}).unwrap();
        assert!(g.failed > 0, "{} is not caught", d.name());
        fired.extend(g.oracles.into_iter().map(|(o, _)| o));
    }
    for o in ORACLE_NAMES {
        assert!(fired.contains(o), "no variant makes {o} fail: {fired:?}");
    }
}

#[test]
fn a_failure_shrinks_to_a_handful_of_operations_and_still_fails() {
    let s = hybrid();
    for d in LifecycleDefect::ALL {
        let connector = kvgeom(Some(d));
        let failing = (0..500)
            .map(|seed| scenario(&s, 4, seed))
            .find_map(|sc| {
                let r = connector.run(&s, &sc).unwrap();
                r.failed().then(|| (sc, r.findings[0].oracle))
            })
            .unwrap_or_else(|| panic!("{} never fails", d.name()));
        let (small, r) = shrink_failure(&s, &failing.0, &connector, failing.1).unwrap();
        assert!(r.findings.iter().any(|f| f.oracle == failing.1));
        assert!(
            small.operations.len() <= 8,
            "{}: {} operations left: {:?}",
            d.name(),
            small.operations.len(),
            small.operations
        );
        // kvgeom's own connector passes the shrunk scenario.
        assert!(!kvgeom(None).run(&s, &small).unwrap().failed());
    }
}
