//! Properties over generated scenarios (`kvgeom::generate`, the generator the
//! cargo-fuzz targets use): every supported case passes every oracle, every
//! deliberately invalid one is rejected with its error, recorded descriptor
//! pairs have equal lengths, and a failure shrinks to a readable case.
//!
//! Failing inputs persist in `proptest-regressions/properties.txt` and are
//! replayed first on the next run. `PROPTEST_CASES=n` overrides the case
//! counts below.

use kvgeom::connector::scheduler::DecodeAllocation;
use kvgeom::defects::Defect;
use kvgeom::generate::strategy::{generated_case, plan_input};
use kvgeom::generate::{Expected, GeneratedCase};
use kvgeom::geometry::{validate, AttentionSpec, GroupKind, KvLayout, Mode};
use kvgeom::scenario::{run_case_detailed, RunOptions};
use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence, TestCaseError, TestError, TestRunner};

/// Scenarios per run of the main property (with the invalid ones mixed in).
const SCENARIOS: u32 = 2_000;
/// Deliberately invalid cases per run of the rejection property.
const INVALID_SCENARIOS: u32 = 300;
/// Planner inputs per run.
const PLANS: u32 = 2_000;

fn config(cases: u32) -> Config {
    Config {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "proptest-regressions/properties.txt",
        ))),
        ..Config::default()
    }
}

proptest! {
    #![proptest_config(config(SCENARIOS))]

    /// Valid cases pass every oracle; invalid ones are rejected as expected.
    #[test]
    fn generated_cases_behave_as_expected(case in generated_case()) {
        if let Err(finding) = case.check(None) {
            return Err(TestCaseError::fail(finding.to_string()));
        }
    }
}

proptest! {
    #![proptest_config(config(INVALID_SCENARIOS))]

    /// Every invalid case is refused with its own error, never accepted.
    #[test]
    fn invalid_cases_are_rejected_with_their_error(
        case in generated_case().prop_filter("a deliberately invalid case", |c| c.expected != Expected::Pass)
    ) {
        match &case.expected {
            Expected::Invalid(expected) => prop_assert_eq!(validate(&case.geometry), Err(expected.clone())),
            Expected::Refused(refusal) => {
                let message = case.geometry.expect_rejection.as_deref();
                prop_assert_eq!(message, Some(refusal.message()));
            }
            Expected::Pass => unreachable!("filtered out"),
        }
        if let Err(finding) = case.check(None) {
            return Err(TestCaseError::fail(finding.to_string()));
        }
    }
}

proptest! {
    #![proptest_config(config(SCENARIOS / 4))]

    /// Every recorded local/remote descriptor pair moves equal byte counts.
    #[test]
    fn recorded_pairs_have_equal_lengths(
        case in generated_case().prop_filter("a valid case", |c| c.expected == Expected::Pass)
    ) {
        let run = run_case_detailed(&case.case(None), &RunOptions::default());
        if let Err(finding) = case.check_report(&run.report) {
            return Err(TestCaseError::fail(finding.to_string()));
        }
        let input = run.oracle_input.expect("a passed case has oracle input");
        prop_assert!(!input.pairs.is_empty() || case.prompt_len <= case.prefix_hit + 1);
        for pair in &input.pairs {
            prop_assert_eq!(
                pair.source.row.len,
                pair.destination.row.len,
                "pair {} of a {} case",
                pair.id,
                case.mode
            );
        }
    }
}

proptest! {
    #![proptest_config(config(PLANS))]

    /// Planning arbitrary block-id lists never addresses a row outside its list.
    #[test]
    fn planned_desc_ids_stay_inside_their_lists(input in plan_input()) {
        if let Err(finding) = input.check() {
            return Err(TestCaseError::fail(finding.to_string()));
        }
    }
}

/// Exhausted input draws the smallest choice everywhere: a valid MLA pull
/// case on TP1 with one-token kernel blocks.
#[test]
fn empty_input_draws_the_smallest_case() {
    let case = GeneratedCase::from_bytes(&[]).unwrap();
    let g = &case.geometry;
    assert_eq!(case.expected, Expected::Pass);
    assert_eq!(case.mode, Mode::Pull);
    assert_eq!((case.prompt_len, case.prefix_hit, case.seed), (1, 0, 0));
    assert_eq!(case.allocation, DecodeAllocation::Mainline);
    assert_eq!(
        g.model.attention,
        Some(AttentionSpec::Mla {
            head_size: 1,
            dtype_bytes: 1
        })
    );
    assert_eq!(g.model.mamba, None);
    assert_eq!(g.model.groups, vec![GroupKind::Attention]);
    assert_eq!(g.model.layer_slots, 1);
    for engine in [&g.prefill, &g.decode] {
        assert_eq!(
            (engine.tp_size, engine.kernel_block, engine.logical_block),
            (1, 1, 1)
        );
        assert_eq!(engine.layout, KvLayout::Nhd);
        assert_eq!(engine.block_padding_bytes, 0);
        assert_eq!(engine.num_logical_blocks, None);
        assert!(!engine.host_buffer && !engine.prefix_caching);
    }
    assert_eq!(case.check(None), Ok(()));
}

/// The Debug form shows the geometry as a file and the replay command.
#[test]
fn debug_shows_the_geometry_file_and_the_replay_command() {
    let case = GeneratedCase::from_bytes(&[]).unwrap();
    let text = format!("{case:?}");
    assert_eq!(
        text,
        "GeneratedCase { mode: pull, prompt_len: 1, prefix_hit: 0, allocation: mainline, seed: 0, \
         expected: every oracle passes }\n\
         --- geometry (save as generated.toml) ---\n\
         name = \"generated\"\n\
         description = \"drawn by kvgeom::generate\"\n\
         \n\
         [model]\n\
         layer_slots = 1\n\
         groups = [\"attention\"]\n\
         \n\
         [model.attention]\n\
         kind = \"mla\"\n\
         head_size = 1\n\
         dtype_bytes = 1\n\
         \n\
         [prefill]\n\
         tp_size = 1\n\
         kernel_block = 1\n\
         logical_block = 1\n\
         \n\
         [decode]\n\
         tp_size = 1\n\
         kernel_block = 1\n\
         logical_block = 1\n\
         --- replay: kvgeom explain generated.toml --prompt 1 --prefix-hit 0 --mode pull \
         --alloc mainline --seed 0"
    );
}

/// A connector defect makes the property fail, and proptest shrinks the
/// failing input to a small case whose Debug shows the geometry.
#[test]
fn a_defect_shrinks_to_a_readable_minimal_case() {
    let mut runner = TestRunner::new(Config {
        cases: 1_000,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&generated_case(), |case| {
        case.check(Some(Defect::DiscardedBlockIds))
            .map_err(|f| TestCaseError::fail(f.to_string()))
    });
    let Err(TestError::Fail(_, minimal)) = result else {
        panic!("the discarded-block-ids defect was not found: {result:?}");
    };
    assert!(minimal.check(Some(Defect::DiscardedBlockIds)).is_err());
    assert_eq!(minimal.check(None), Ok(()));
    let text = format!("{minimal:?}");
    for part in [
        "[model]",
        "[prefill]",
        "[decode]",
        "kvgeom explain generated.toml",
    ] {
        assert!(text.contains(part), "{part} missing from:\n{text}");
    }
    assert!(
        text.lines().count() <= 40,
        "the shrunk case is not small:\n{text}"
    );
}
