//! Properties over generated scenarios (`kvgeom::generate`, the generator the
//! cargo-fuzz targets use): every supported case passes every oracle, every
//! deliberately invalid one is rejected with its error, recorded descriptor
//! pairs have equal lengths, and a failure shrinks to a readable case.
//!
//! Failing inputs persist in `proptest-regressions/properties.txt` and are
//! replayed first on the next run. `PROPTEST_CASES=n` overrides the case
//! counts below.

use kvgeom::defects::Defect;
use kvgeom::generate::strategy::{generated_case, plan_input};
use kvgeom::generate::{Expected, GeneratedCase};
use kvgeom::geometry::{validate, AttentionSpec, GroupKind, KvLayout, Mode};
use kvgeom::scenario::RunOptions;
use kvgeom::scheduler::DecodeAllocation;
use kvgeom::under_test::run_case_detailed;
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
                let message = case.geometry.expect_rejection.as_ref().and_then(|r| r.in_both());
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
        // At least one token is transferred (the prefix hit is below M).
        prop_assert!(!input.pairs.is_empty());
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

    /// The connector's planner, on arbitrary requests, never addresses a row
    /// outside its list and pairs every attention entry with the same token.
    #[test]
    fn planned_transfers_stay_inside_their_lists_and_token_aligned(input in plan_input()) {
        if let Err(finding) = input.check(&kvgeom::connector::Policy::default()) {
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

/// The generator reaches every shape it promises (drawn from seeded random
/// bytes, without running the cases).
#[test]
fn the_generator_reaches_every_promised_shape() {
    use kvgeom::generate::Refusal;
    use kvgeom::geometry::MambaKind;
    use kvgeom::internals::SplitMix;
    use std::collections::BTreeSet;

    let mut rng = SplitMix::new(7);
    let mut seen: BTreeSet<String> = BTreeSet::new();
    for _ in 0..20_000 {
        let len = 8 + rng.below(120) as usize;
        let bytes: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
        let case = GeneratedCase::from_bytes(&bytes).unwrap();
        let (g, p, d) = (
            &case.geometry,
            &case.geometry.prefill,
            &case.geometry.decode,
        );
        match &case.expected {
            Expected::Invalid(v) => {
                seen.insert(format!("invalid {}", v.field));
                continue;
            }
            Expected::Refused(r) => {
                seen.insert(format!("refused {r:?}"));
                continue;
            }
            Expected::Pass => {}
        }
        let kernels = if p.kernel_block == d.kernel_block {
            "equal"
        } else if d.kernel_block % p.kernel_block == 0 {
            "decode multiple"
        } else if p.kernel_block % d.kernel_block == 0 {
            "prefill multiple"
        } else {
            "gcd split"
        };
        let tp = match p.tp_size.cmp(&d.tp_size) {
            std::cmp::Ordering::Less => "decode larger",
            std::cmp::Ordering::Equal => "equal",
            std::cmp::Ordering::Greater => "prefill larger",
        };
        let facts = [
            format!("mode {}", case.mode),
            format!("mla {}", g.model.is_mla()),
            format!("mamba {:?}", g.model.mamba.as_ref().map(|m| m.kind)),
            format!("kernels {kernels}"),
            format!("tp {tp}"),
            format!("ppl differ {}", p.ppl() != d.ppl()),
            format!("prefill padded {}", p.block_padding_bytes > 0),
            format!("decode padded {}", d.block_padding_bytes > 0),
            format!("decode host buffer {}", d.host_buffer),
            format!("prefix hit {}", case.prefix_hit > 0),
            format!("allocation {}", case.allocation.as_str()),
            format!("fixed pool {}", d.num_logical_blocks.is_some()),
            format!("layer slots {}", g.model.layer_slots),
            format!(
                "slots without mamba state {}",
                g.model.state_slot_count() < g.model.layer_slots && g.model.has_mamba()
            ),
            format!(
                "attention first {}",
                g.model.groups[0] == GroupKind::Attention
            ),
            format!("layout {:?}", d.layout),
            // Regions where vLLM 0.33.0's end-aligned pairing goes wrong.
            format!(
                "no mamba, lists end apart {}",
                !g.model.has_mamba() && lists_end_apart(p, d)
            ),
            format!(
                "prefix hit, logical blocks differ {}",
                case.prefix_hit > 0 && p.logical_block != d.logical_block
            ),
            format!(
                "prefix hit, last-token block {}",
                case.prefix_hit > 0 && case.allocation == DecodeAllocation::WithLastToken
            ),
            // One Mamba2 group, replicated at TP > 1, with TP sizes that differ.
            format!(
                "replicated groups, tp {tp}: {}",
                g.model.mamba.as_ref().is_some_and(|m| m.n_groups.is_some())
            ),
        ];
        seen.extend(facts);
    }
    let mut expected: Vec<String> = Refusal::ALL
        .iter()
        .map(|r| format!("refused {r:?}"))
        .collect();
    for field in [
        "model.groups",
        "model.layer_slots",
        "model.attention.dtype_bytes",
        "model.attention.total_kv_heads",
        "model.mamba.conv_dims[0]",
        "model.mamba.conv_dims[1]",
        "model.mamba.conv_dims[2]",
        "prefill.kernel_block",
        "decode.kernel_block",
        "prefill.tp_size",
        "decode.tp_size",
        "prefill.logical_block",
    ] {
        expected.push(format!("invalid {field}"));
    }
    for mode in ["pull", "push"] {
        expected.push(format!("mode {mode}"));
    }
    let kinds = [
        None,
        Some(MambaKind::Mamba1),
        Some(MambaKind::Mamba2),
        Some(MambaKind::Gdn),
        Some(MambaKind::Kda),
    ];
    expected.extend(kinds.iter().map(|k| format!("mamba {k:?}")));
    for kernels in ["equal", "decode multiple", "prefill multiple", "gcd split"] {
        expected.push(format!("kernels {kernels}"));
    }
    for tp in ["decode larger", "equal", "prefill larger"] {
        expected.push(format!("tp {tp}"));
        expected.push(format!("replicated groups, tp {tp}: true"));
    }
    for flag in [
        "mla",
        "ppl differ",
        "prefill padded",
        "decode padded",
        "decode host buffer",
        "prefix hit",
        "fixed pool",
        "attention first",
        "no mamba, lists end apart",
        "prefix hit, logical blocks differ",
        "prefix hit, last-token block",
        "slots without mamba state",
    ] {
        expected.push(format!("{flag} true"));
        expected.push(format!("{flag} false"));
    }
    for slots in 1..=3 {
        expected.push(format!("layer slots {slots}"));
    }
    expected.push("allocation mainline".into());
    expected.push("allocation with-last-token".into());
    expected.push("layout Nhd".into());
    expected.push("layout Hnd".into());
    let missing: Vec<&String> = expected.iter().filter(|e| !seen.contains(*e)).collect();
    assert!(missing.is_empty(), "never drawn: {missing:?}");
}

/// Whether prefill's and decode's lists of a request end on different
/// tokens, so that end-aligning them (vLLM 0.33.0) pairs the wrong tokens:
/// with equal kernels, different logical blocks; with a kernel ratio, a
/// decode logical block that prefill's does not divide.
fn lists_end_apart(
    prefill: &kvgeom::geometry::EngineGeometry,
    decode: &kvgeom::geometry::EngineGeometry,
) -> bool {
    let ratio = decode.kernel_block / prefill.kernel_block;
    if ratio <= 1 {
        decode.ppl() != prefill.ppl()
    } else {
        (ratio * decode.ppl()) % prefill.ppl() != 0
    }
}

/// The plan check is trusted only if a known planning defect fails it:
/// vLLM 0.33.0's end-trim alignment must be found, and shrunk to a request
/// that kvgeom's own planner pairs correctly.
#[test]
fn the_plan_check_finds_end_trim_alignment() {
    let end_trim = Defect::EndTrimAlignment.policy();
    let mut runner = TestRunner::new(Config {
        cases: 2_000,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&plan_input(), |input| {
        input
            .check(&end_trim)
            .map_err(|f| TestCaseError::fail(f.to_string()))
    });
    let Err(TestError::Fail(_, minimal)) = result else {
        panic!("end-trim alignment was not found by the plan check: {result:?}");
    };
    assert!(minimal.check(&end_trim).is_err());
    assert_eq!(minimal.check(&kvgeom::connector::Policy::default()), Ok(()));
}
