//! Geometry files: the shipped geometries, every validation rule, syntax
//! errors, writing and folder loading.

use std::fs;
use std::path::{Path, PathBuf};

use kvgeom::geometry::{
    load_geometries, load_geometry, parse_geometry, to_toml, AttentionSpec, ExpectedRejection,
    Geometry, GeometryError, KvLayout, MambaKind, Rule,
};

use crate::support::scratch;

const FILE: &str = "geometries/bad.toml";

/// G1, as a user would write it: the base that each rule test breaks once.
const BASE: &str = r#"
# G1: KimiLinear-like MLA + KDA.
description = "MLA + two KDA groups, D TP1 12/4 <- P TP2 8/4"
prompts = ["2..=5", 9]

[model]
layer_slots = 2
groups = ["attention", "mamba", "mamba"]

[model.attention]
kind = "mla"
head_size = 6
dtype_bytes = 2

[model.mamba]
kind = "kda"
conv_dims = [2, 2, 4]
conv_rows = 3
conv_dtype_bytes = 2
ssm_state_bytes = 64

[prefill]
tp_size = 2
kernel_block = 4
logical_block = 8

[decode]
tp_size = 1
kernel_block = 4
logical_block = 12
"#;

/// A dense GQA model without mamba groups.
const GQA: &str = r#"
description = "dense GQA"

[model]
layer_slots = 1
groups = ["attention"]

[model.attention]
kind = "full"
total_kv_heads = 2
head_size = 8
dtype_bytes = 2

[prefill]
tp_size = 1
kernel_block = 16
logical_block = 16

[decode]
tp_size = 4
kernel_block = 16
logical_block = 16
"#;

/// `text` with each `(from, to)` applied once; `from` must occur.
fn edit(text: &str, edits: &[(&str, &str)]) -> String {
    let mut out = text.to_string();
    for (from, to) in edits {
        assert!(out.contains(from), "test edit target {from:?} not found");
        out = out.replacen(from, to, 1);
    }
    out
}

/// Parse `text` as FILE and expect exactly `FILE: field: rule`.
fn assert_rule(text: &str, field: &str, rule: &str) {
    let err = parse_geometry(FILE, text).expect_err("the geometry must be rejected");
    assert_eq!(err.to_string(), format!("{FILE}: {field}: {rule}"));
    assert_eq!(err.field(), Some(field));
}

/// Parse `text` as FILE and expect a toml error that mentions each fragment.
fn assert_syntax(text: &str, line: usize, fragments: &[&str]) -> GeometryError {
    let err = parse_geometry(FILE, text).expect_err("the geometry must be rejected");
    let message = err.to_string();
    assert!(
        matches!(err, GeometryError::Syntax { line: Some(l), .. } if l == line),
        "expected a syntax error at line {line}: {err:?}"
    );
    assert!(message.starts_with(&format!("{FILE}: ")), "{message}");
    assert!(message.contains(&format!("line {line}")), "{message}");
    for fragment in fragments {
        assert!(message.contains(fragment), "{fragment:?} not in: {message}");
    }
    err
}

fn geometries_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("geometries")
}

/// Every shipped geometry, `geometries/models/` included (some of its files
/// name a model config, so they load through the sweep's loader).
fn shipped() -> Vec<Geometry> {
    kvgeom::sweep::plan::load_sources(&[geometries_dir()])
        .expect("every shipped geometry loads")
        .into_iter()
        .map(|s| (*s.geometry).clone())
        .collect()
}

fn find<'a>(all: &'a [Geometry], name: &str) -> &'a Geometry {
    all.iter()
        .find(|g| g.name == name)
        .unwrap_or_else(|| panic!("no geometry named {name}"))
}

// ---------------------------------------------------------------- shipped

#[test]
fn shipped_geometries_load_in_name_order() {
    let names: Vec<String> = shipped().into_iter().map(|g| g.name).collect();
    assert_eq!(
        names,
        [
            "deepseek-mla",
            "g1-mla-kda-ppl3-vs-2",
            "g2-mla-kda-ppl9-vs-2",
            "g3-mla-kda-ppl6-vs-1",
            "g4-mla-kda-remote-larger",
            "g5-mla-kda-mixed-kernel",
            "g6-kimi-linear-scale",
            "gqa-kernel-ratio4",
            "gqa-mamba2-partly-filled-groups",
            "gqa-prefill-logical-larger",
            "jamba-gqa-mamba1",
            "llama-gqa-prefix-cache",
            "mamba2-replicated-groups-p1-d2",
            "mamba2-replicated-groups-p4-d2",
            "mla-decode-logical-larger",
            "mla-interleaved-kernel-ratio2",
            "mla-kda-decode-tp2",
            "mla-kda-equal-ppl-prefix-cache",
            "mla-kda-kernel-ratio-equal-ppl-prefix-cache",
            "mla-kda-prefill-kernel-larger",
            "mla-kda-push-prefix-cache-prefill-kernel-larger",
            "mla-kernel-ratio4-prefix-cache",
            "nemotron-h-gqa-mamba2-hnd",
            "qwen3-next-gqa-gdn-decode-tp2",
            "reject-g1-prefix-caching",
            "reject-gqa-mamba2-head-sharded-kernel-ratio",
            "reject-gqa-nhd-replicated-heads",
            "reject-host-buffer-kernel-ratio",
            "reject-nemotron-h-decode-kernel-smaller",
            // geometries/models/, after the folder's own files
            "deepseek-v3-p8-flashmla-d4-flash-attn-mla-block-size-64",
            "falcon-h1-p4-flashinfer-d2-flashinfer",
            "kimi-linear-p1-d2-flash-attn-mla-push-refused",
            "kimi-linear-p8-flashmla-d2-cutlass-mla",
            "nemotron-h-p2-flashinfer-d2-flash-attn",
            "qwen3-next-p2-d4-flashinfer-block-size-64",
            "qwen3-next-p8-d2-flashinfer-from-config",
            "qwen3-next-p8-flashinfer-d2-flashinfer",
            "reject-deepseek-v3-p8-flashmla-d4-flash-attn-mla",
            "reject-jamba-p2-flash-attn-d1-flashinfer",
            "reject-nemotron-h-p2-flashinfer-d2-flash-attn-compat-hash",
            "reject-qwen3-next-p2-d4-flashinfer",
            // geometries/sglang/: SGLang's pools (stack = "sglang")
            "gqa-2heads-p1-d4",
            "gqa-2heads-p4-d1",
            "gqa-4heads-p2-d8",
            "gqa-8heads-p2-d4",
            "gqa-8heads-p4-d2",
            "gqa-dp-attention-decode",
            "gqa-v-head-size-p1-d2",
            "hybrid-gdn-p1-d2",
            "hybrid-gdn-p2-d1",
            "hybrid-gdn-p8-d1",
            "hybrid-kda-mla-p1-d2",
            "hybrid-kda-mla-p2-d1",
            "hybrid-mamba2-1group-p1-d2",
            "hybrid-mamba2-1group-p2-d1",
            "hybrid-mamba2-xbc-p1-d2",
            "hybrid-mamba2-xbc-p2-d1",
            "mha-equal-tp",
            "mla-p1-d4",
            "mla-p2-d1",
            "reject-page-size-mismatch",
        ]
    );
}

#[test]
fn shipped_geometries_round_trip_through_to_toml() {
    for geometry in shipped() {
        let text = to_toml(&geometry);
        let again = parse_geometry("round-trip.toml", &text)
            .unwrap_or_else(|e| panic!("{}: {e}\n{text}", geometry.name));
        assert_eq!(again, geometry, "{text}");
    }
}

#[test]
fn shipped_files_start_with_a_comment_and_have_a_description() {
    let models = geometries_dir().join("models");
    let sglang = geometries_dir().join("sglang");
    let entries = fs::read_dir(geometries_dir())
        .unwrap()
        .chain(fs::read_dir(&models).unwrap())
        .chain(fs::read_dir(&sglang).unwrap());
    for entry in entries {
        let path = entry.unwrap().path();
        if path.is_dir() {
            continue;
        }
        let text = fs::read_to_string(&path).unwrap();
        assert!(
            text.starts_with("# "),
            "{} must start with a comment",
            path.display()
        );
        let geometry = kvgeom::derive::load_geometry_file(&path).unwrap();
        assert!(geometry.description.len() > 20, "{}", path.display());
    }
}

#[test]
fn sweep_geometries_match_vllm_g1_to_g4() {
    let all = shipped();
    // (name, decode logical, prefill logical, decode ppl, prefill ppl)
    for (name, d_logical, p_logical, d_ppl, p_ppl) in [
        ("g1-mla-kda-ppl3-vs-2", 12, 8, 3, 2),
        ("g2-mla-kda-ppl9-vs-2", 36, 8, 9, 2),
        ("g3-mla-kda-ppl6-vs-1", 24, 4, 6, 1),
        ("g4-mla-kda-remote-larger", 16, 24, 4, 6),
    ] {
        let g = find(&all, name);
        assert_eq!(g.decode.logical_block, d_logical, "{name}");
        assert_eq!(g.prefill.logical_block, p_logical, "{name}");
        let ratios = g.ratios();
        assert_eq!(
            (ratios.decode_ppl, ratios.prefill_ppl),
            (d_ppl, p_ppl),
            "{name}"
        );
        assert_eq!(ratios.pull_tp_ratio, Some(-2), "{name}");
        assert_eq!(ratios.pull_block_size_ratio, Some(1), "{name}");
        assert_eq!(g.prompts, Some((2..=39).collect()), "{name}");
        assert_eq!(
            g.model.attention,
            Some(AttentionSpec::Mla {
                head_size: 6,
                dtype_bytes: 2
            })
        );
        let mamba = g.model.mamba.as_ref().unwrap();
        assert_eq!(mamba.kind, MambaKind::Kda);
        assert_eq!(mamba.ssm_sizes(1).0, 48, "{name}: conv bytes at TP1");
        assert_eq!(g.expect_rejection, None);
    }
    // G3 keeps vLLM's block geometry but shrinks the temporal state so one
    // TP2 rank's state (24 + 24 bytes) fits P's 48-byte page exactly.
    let g3 = find(&all, "g3-mla-kda-ppl6-vs-1");
    assert_eq!(g3.model.mamba.as_ref().unwrap().ssm_sizes(2), (24, 24));
    assert_eq!(g3.prefill.unified_page_bytes(&g3.model), 48);
}

#[test]
fn g5_and_g6_match_vllm() {
    let all = shipped();
    let g5 = find(&all, "g5-mla-kda-mixed-kernel");
    let r5 = g5.ratios();
    assert_eq!(r5.pull_block_size_ratio, Some(2));
    assert_eq!((r5.decode_ppl, r5.prefill_ppl), (3, 2));
    assert_eq!(
        g5.prompts,
        Some(vec![
            2, 5, 8, 9, 13, 16, 17, 21, 24, 25, 29, 32, 33, 41, 48, 49
        ])
    );

    let g6 = find(&all, "g6-kimi-linear-scale");
    let r6 = g6.ratios();
    assert_eq!(r6.pull_tp_ratio, Some(-8));
    assert_eq!((r6.decode_ppl, r6.prefill_ppl), (90, 12));
    assert_eq!(g6.decode.unified_page_bytes(&g6.model), 69_120);
    assert_eq!(g6.prefill.unified_page_bytes(&g6.model), 9_216);
    let mamba = g6.model.mamba.as_ref().unwrap();
    assert_eq!(mamba.conv_projection_bytes(8), [12, 12, 24]);
    assert_eq!(mamba.ssm_sizes(8), (48, 64));
    assert_eq!(g6.prompts.as_ref().map(Vec::len), Some(27));
}

#[test]
fn other_shipped_geometries_cover_the_promised_shapes() {
    let all = shipped();
    let d_tp2 = find(&all, "mla-kda-decode-tp2");
    assert_eq!(d_tp2.ratios().pull_tp_ratio, Some(2));

    let nemotron = find(&all, "nemotron-h-gqa-mamba2-hnd");
    assert_eq!(nemotron.decode.layout, KvLayout::Hnd);
    assert_eq!(nemotron.prefill.layout, KvLayout::Hnd);
    assert_eq!(
        nemotron.model.mamba.as_ref().unwrap().kind,
        MambaKind::Mamba2
    );
    assert!(!nemotron.model.is_mla());

    let gqa = find(&all, "gqa-kernel-ratio4");
    assert!(!gqa.model.has_mamba());
    assert_eq!(gqa.ratios().pull_block_size_ratio, Some(4));

    let deepseek = find(&all, "deepseek-mla");
    assert!(deepseek.model.is_mla() && !deepseek.model.has_mamba());
}

#[test]
fn rejection_geometries_use_the_connector_messages() {
    let all = shipped();
    for (name, message) in [
        (
            "reject-host-buffer-kernel-ratio",
            "Heterogeneous block sizes are not supported with host buffer",
        ),
        (
            "reject-nemotron-h-decode-kernel-smaller",
            "is not divisible by remote block size",
        ),
        (
            "reject-g1-prefix-caching",
            "Prefix caching with heterogeneous physical_blocks_per_logical is not supported",
        ),
        (
            "reject-gqa-mamba2-head-sharded-kernel-ratio",
            "Head-sharded attention reads with P_TP > D_TP and heterogeneous block sizes are not supported",
        ),
        (
            "reject-gqa-nhd-replicated-heads",
            "Heterogeneous TP head-dimension splitting requires contiguous heads",
        ),
        (
            "reject-nemotron-h-p2-flashinfer-d2-flash-attn-compat-hash",
            "NIXL compatibility hash mismatch",
        ),
    ] {
        let expected = find(&all, name).expect_rejection.as_ref();
        assert_eq!(expected.and_then(|r| r.in_both()), Some(message));
    }
    let host = find(&all, "reject-host-buffer-kernel-ratio");
    assert!(host.decode.host_buffer && host.prefill.host_buffer);
    assert_eq!(host.ratios().pull_block_size_ratio, Some(2));
    let nemotron = find(&all, "reject-nemotron-h-decode-kernel-smaller");
    assert_eq!(nemotron.ratios().pull_block_size_ratio, None);
    let cached = find(&all, "reject-g1-prefix-caching");
    assert!(cached.decode.prefix_caching && cached.prefill.prefix_caching);
    let sharded = find(&all, "reject-gqa-mamba2-head-sharded-kernel-ratio");
    assert_eq!(sharded.ratios().pull_tp_ratio, Some(-2));
    assert_eq!(sharded.ratios().pull_block_size_ratio, Some(2));
    // Every geometry without a rejection is one the connector must serve:
    // five here, three derived pairs in geometries/models/, and one derived
    // pair refused in push only (SGLang's refusals are SGLang's).
    let both = all
        .iter()
        .filter(|g| g.stack == kvgeom::geometry::Stack::Vllm)
        .filter(|g| {
            g.expect_rejection
                .as_ref()
                .is_some_and(|r| r.in_both().is_some())
        })
        .count();
    assert_eq!(both, 9);
    let kimi = find(&all, "kimi-linear-p1-d2-flash-attn-mla-push-refused");
    assert_eq!(
        kimi.expect_rejection,
        Some(ExpectedRejection {
            pull: None,
            push: Some("is not divisible by remote block size".into()),
        })
    );
    let per_mode = all
        .iter()
        .filter(|g| {
            g.expect_rejection
                .as_ref()
                .is_some_and(|r| r.in_both().is_none())
        })
        .count();
    assert_eq!(per_mode, 1);
}

// ---------------------------------------------------------------- parsing and writing

#[test]
fn the_documented_example_parses() {
    let doc =
        fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/geometry-format.md"))
            .unwrap();
    let start = doc.find("```toml\n").expect("a toml example") + "```toml\n".len();
    let end = start + doc[start..].find("```").unwrap();
    let g = parse_geometry("docs/geometry-format.md", &doc[start..end]).unwrap();
    assert_eq!(g.name, "g1-mla-kda-ppl3-vs-2");
    assert_eq!(g.prompts.as_ref().map(Vec::len), Some(40));
    assert_eq!(g.ratios().decode_ppl, 3);
}

#[test]
fn base_parses_with_defaults() {
    let g = parse_geometry("geometries/g1.toml", BASE).unwrap();
    assert_eq!(g.name, "g1");
    assert_eq!(g.prompts, Some(vec![2, 3, 4, 5, 9]));
    assert_eq!(g.decode.layout, KvLayout::Nhd);
    assert_eq!(g.decode.num_logical_blocks, None);
    assert!(!g.decode.host_buffer && !g.decode.prefix_caching);
    assert_eq!(g.expect_rejection, None);
}

#[test]
fn name_field_overrides_the_file_stem() {
    let text = format!("name = \"custom\"\n{BASE}");
    assert_eq!(parse_geometry(FILE, &text).unwrap().name, "custom");
}

#[test]
fn layout_accepts_vllm_names() {
    let text = edit(
        BASE,
        &[(
            "logical_block = 12",
            "logical_block = 12\nlayout = \"LBHNC\"",
        )],
    );
    assert_eq!(
        parse_geometry(FILE, &text).unwrap().decode.layout,
        KvLayout::Hnd
    );
}

#[test]
fn to_toml_writes_the_documented_format() {
    let g = parse_geometry("geometries/g1.toml", BASE).unwrap();
    // BASE as written, but for its comment and with the name the file stem gave.
    let written = edit(
        BASE,
        &[("\n# G1: KimiLinear-like MLA + KDA.\n", "name = \"g1\"\n")],
    );
    assert_eq!(to_toml(&g), written);
}

#[test]
fn every_optional_field_round_trips() {
    let mut g = parse_geometry(FILE, GQA).unwrap();
    g.name = "all.fields_1".into();
    g.description = r#"quotes " and \ backslash, 'single' too"#.into();
    g.expect_rejection = Some(ExpectedRejection::both(
        "is not divisible by remote block size",
    ));
    g.prompts = Some(vec![40, 1, 2, 3, 7, 8, 100, 101, 102, 103]);
    g.decode.num_logical_blocks = Some(12);
    g.decode.layout = KvLayout::Hnd;
    g.decode.host_buffer = true;
    g.prefill.prefix_caching = true;
    g.handshake.prefill.backend = Some("FLASHINFER".into());
    g.handshake.decode.backend = Some("FLASH_ATTN".into());
    g.handshake.decode.kv_cache_dtype = Some("fp8_e4m3".into());
    g.handshake.enforce = false;
    let text = to_toml(&g);
    assert!(
        text.contains(r#"prompts = [40, "1..=3", 7, 8, "100..=103"]"#),
        "{text}"
    );
    assert!(
        text.contains("enforce_handshake_compat = false\n"),
        "{text}"
    );
    assert!(text.contains("backend = \"FLASHINFER\"\n"), "{text}");
    assert!(text.contains("kv_cache_dtype = \"fp8_e4m3\"\n"), "{text}");
    assert_eq!(parse_geometry(FILE, &text).unwrap(), g);
}

#[test]
fn rule_backend_and_cache_dtype_are_spelled_as_vllm_spells_them() {
    assert_rule(
        &edit(
            BASE,
            &[("[prefill]\n", "[prefill]\nbackend = \"flash attn\"\n")],
        ),
        "prefill.backend",
        "`flash attn` is not an attention backend's name as vLLM spells it \
         (`FLASHINFER`, `FLASH_ATTN`, `FLASHMLA`, ...)",
    );
    assert_rule(
        &edit(
            BASE,
            &[("[decode]\n", "[decode]\nkv_cache_dtype = \"FP8\"\n")],
        ),
        "decode.kv_cache_dtype",
        "`FP8` is not a KV-cache dtype as vLLM spells it (`auto`, `fp8`, `fp8_e4m3`, ...)",
    );
}

// ---------------------------------------------------------------- one test per rule

#[test]
fn rule_description_not_empty() {
    assert_rule(
        &edit(
            BASE,
            &[(
                "description = \"MLA + two KDA groups, D TP1 12/4 <- P TP2 8/4\"",
                "description = \"  \"",
            )],
        ),
        "description",
        "must not be empty",
    );
}

#[test]
fn rule_description_is_one_line() {
    let text = edit(BASE, &[("\"MLA + two", "\"\"\"first line\nMLA + two")]).replacen(
        "8/4\"\n",
        "8/4\"\"\"\n",
        1,
    );
    assert_rule(&text, "description", "must be one line");
}

#[test]
fn rule_name_characters() {
    assert_rule(
        &format!("name = \"my geometry\"\n{BASE}"),
        "name",
        "`my geometry` may only contain ASCII letters, digits, '-', '_' and '.' \
         (the name defaults to the file stem; set `name` to override it)",
    );
}

#[test]
fn rule_name_not_empty() {
    assert_rule(&format!("name = \"\"\n{BASE}"), "name", "must not be empty");
}

#[test]
fn rule_expect_rejection_not_empty() {
    assert_rule(
        &format!("expect_rejection = \"\"\n{BASE}"),
        "expect_rejection",
        "must not be empty",
    );
}

#[test]
fn expect_rejection_per_mode_parses_and_round_trips() {
    let g = parse_geometry(
        FILE,
        &format!("expect_rejection = {{ push = \"is not divisible\" }}\n{BASE}"),
    )
    .unwrap();
    let expected = g.expect_rejection.clone().unwrap();
    assert_eq!(expected.in_mode(kvgeom::geometry::Mode::Pull), None);
    assert_eq!(
        expected.in_mode(kvgeom::geometry::Mode::Push),
        Some("is not divisible")
    );
    assert_eq!(expected.in_both(), None);
    let text = to_toml(&g);
    assert!(
        text.contains(r#"expect_rejection = { push = "is not divisible" }"#),
        "{text}"
    );
    assert_eq!(parse_geometry(FILE, &text).unwrap(), g);
    // A table naming both modes with one text is the single form.
    let same = parse_geometry(
        FILE,
        &format!("expect_rejection = {{ pull = \"x\", push = \"x\" }}\n{BASE}"),
    )
    .unwrap();
    assert_eq!(same.expect_rejection, Some(ExpectedRejection::both("x")));
    assert!(to_toml(&same).contains("expect_rejection = \"x\"\n"));
}

#[test]
fn rule_expect_rejection_per_mode() {
    assert_rule(
        &format!("expect_rejection = {{}}\n{BASE}"),
        "expect_rejection",
        "names no mode: give `pull`, `push` or both (`{ push = \"...\" }`), or one string for both modes",
    );
    assert_rule(
        &format!("expect_rejection = {{ pull = \"\" }}\n{BASE}"),
        "expect_rejection.pull",
        "must not be empty",
    );
    assert_rule(
        &format!("expect_rejection = {{ pull = \"a\", push = \"b\\nc\" }}\n{BASE}"),
        "expect_rejection.push",
        "must be one line",
    );
    assert_syntax(
        &format!("expect_rejection = {{ pulls = \"a\" }}\n{BASE}"),
        1,
        &["unknown field `pulls`, expected `pull` or `push`"],
    );
    assert_syntax(
        &format!("expect_rejection = 3\n{BASE}"),
        1,
        &["a string (both modes) or a table with `pull` and/or `push` strings"],
    );
}

/// BASE with a Mamba2 model of one B/C group and engines of TP `p` and `d`.
fn mamba2(n_groups: &str, p: u32, d: u32) -> String {
    edit(
        BASE,
        &[
            ("kind = \"kda\"", "kind = \"mamba2\""),
            (
                "conv_dims = [2, 2, 4]",
                &format!("conv_dims = [8, 2, 2]{n_groups}"),
            ),
            ("tp_size = 2", &format!("tp_size = {p}")),
            ("tp_size = 1", &format!("tp_size = {d}")),
        ],
    )
}

#[test]
fn replicated_mamba2_groups_keep_their_width() {
    let g = parse_geometry(FILE, &mamba2("\nn_groups = 1", 2, 1)).unwrap();
    let m = g.model.mamba.as_ref().unwrap();
    assert_eq!(m.n_groups, Some(1));
    // x splits over TP; the one group is whole on every rank.
    assert_eq!(m.conv_projection_bytes(2), [24, 12, 12]);
    assert_eq!(m.conv_projection_bytes(1), [48, 12, 12]);
    assert!(to_toml(&g).contains("n_groups = 1\n"));
    assert_eq!(parse_geometry(FILE, &to_toml(&g)).unwrap(), g);
    // Without n_groups the same totals shard B and C too.
    let sharded = parse_geometry(FILE, &mamba2("", 2, 1)).unwrap();
    assert_eq!(
        sharded.model.mamba.unwrap().conv_projection_bytes(2),
        [24, 6, 6]
    );
}

#[test]
fn rule_n_groups() {
    assert_rule(
        &mamba2("\nn_groups = 2", 4, 1),
        "model.mamba.n_groups",
        "2 Mamba2 groups do not split over prefill.tp_size = 4; vLLM replicates groups only when \
         there is one (\"If tensor parallel world size does not divide num_groups, then num_groups \
         must equal 1.\")",
    );
    assert_rule(
        &mamba2("\nn_groups = 4", 1, 1),
        "model.mamba.conv_dims[1]",
        "2 B channels are not a whole number of 4 groups",
    );
    assert_rule(
        &mamba2("\nn_groups = 0", 1, 1),
        "model.mamba.n_groups",
        "must be at least 1, found 0",
    );
    assert_rule(
        &edit(
            BASE,
            &[(
                "conv_dims = [2, 2, 4]",
                "conv_dims = [2, 2, 4]\nn_groups = 1",
            )],
        ),
        "model.mamba.n_groups",
        "n_groups only applies to kind \"mamba2\" (its B and C groups), found kind \"kda\"",
    );
    // Sharded sub-projections must still split: x over TP 4.
    assert_rule(
        &mamba2("\nn_groups = 1", 1, 1)
            .replace("conv_dims = [8, 2, 2]", "conv_dims = [6, 2, 2]")
            .replace("tp_size = 1", "tp_size = 4"),
        "model.mamba.conv_dims[0]",
        "6 conv channels do not split evenly over prefill.tp_size = 4",
    );
}

#[test]
fn rule_layer_slots_positive() {
    assert_rule(
        &edit(BASE, &[("layer_slots = 2", "layer_slots = 0")]),
        "model.layer_slots",
        "must be at least 1, found 0",
    );
}

#[test]
fn rule_state_slots_within_layer_slots_on_a_mamba_model() {
    let with = |n: &str| {
        edit(
            BASE,
            &[(
                "layer_slots = 2",
                &format!("layer_slots = 2\nstate_slots = {n}"),
            )],
        )
    };
    assert_rule(
        &with("0"),
        "model.state_slots",
        "must be at least 1, found 0",
    );
    assert_rule(
        &with("3"),
        "model.state_slots",
        "3 is more than model.layer_slots (2): it counts the layer slots that hold a mamba layer",
    );
    assert_rule(
        &edit(GQA, &[("layer_slots = 1", "layer_slots = 1\nstate_slots = 1")]),
        "model.state_slots",
        "only applies to a model with mamba groups: it counts the layer slots holding a mamba layer",
    );
    let g = parse_geometry(FILE, &with("1")).expect("one of two slots holds state");
    assert_eq!((g.model.layer_slots, g.model.state_slot_count()), (2, 1));
    // Written back, it reads the same.
    let again = parse_geometry(FILE, &to_toml(&g)).unwrap();
    assert_eq!(again.model, g.model);
    let full = parse_geometry(FILE, BASE).unwrap();
    assert_eq!(
        (full.model.state_slots, full.model.state_slot_count()),
        (None, 2)
    );
}

#[test]
fn rule_groups_not_empty() {
    assert_rule(
        &edit(
            BASE,
            &[(
                "groups = [\"attention\", \"mamba\", \"mamba\"]",
                "groups = []",
            )],
        ),
        "model.groups",
        "lists no KV-cache group; give at least one of \"attention\", \"mamba\"",
    );
}

const MLA_TABLE: &str = "[model.attention]\nkind = \"mla\"\nhead_size = 6\ndtype_bytes = 2\n";
const KDA_TABLE: &str = "[model.mamba]\nkind = \"kda\"\nconv_dims = [2, 2, 4]\nconv_rows = 3\nconv_dtype_bytes = 2\nssm_state_bytes = 64\n";

#[test]
fn rule_group_kind_needs_its_spec() {
    assert_rule(
        &edit(BASE, &[(MLA_TABLE, "")]),
        "model.attention",
        "group kind \"attention\" needs a [model.attention] table",
    );
    assert_rule(
        &edit(BASE, &[(KDA_TABLE, "")]),
        "model.mamba",
        "group kind \"mamba\" needs a [model.mamba] table",
    );
}

#[test]
fn rule_spec_without_group_is_refused() {
    assert_rule(
        &edit(
            BASE,
            &[(
                "groups = [\"attention\", \"mamba\", \"mamba\"]",
                "groups = [\"attention\"]",
            )],
        ),
        "model.mamba",
        "[model.mamba] is given but no entry of model.groups is \"mamba\"",
    );
}

#[test]
fn rule_mamba_needs_attention() {
    assert_rule(
        &edit(
            BASE,
            &[
                (
                    "groups = [\"attention\", \"mamba\", \"mamba\"]",
                    "groups = [\"mamba\"]",
                ),
                (MLA_TABLE, ""),
            ],
        ),
        "model.groups",
        "a model with mamba groups needs an attention group too: the padded page that holds \
         one mamba state is sized from attention bytes per token",
    );
}

#[test]
fn rule_full_attention_needs_kv_heads() {
    assert_rule(
        &edit(GQA, &[("total_kv_heads = 2\n", "")]),
        "model.attention.total_kv_heads",
        "kind \"full\" needs total_kv_heads",
    );
}

#[test]
fn rule_mla_has_no_kv_heads() {
    assert_rule(
        &edit(
            BASE,
            &[("kind = \"mla\"", "kind = \"mla\"\ntotal_kv_heads = 1")],
        ),
        "model.attention.total_kv_heads",
        "total_kv_heads only applies to kind \"full\" (MLA has one latent head)",
    );
}

#[test]
fn rule_attention_sizes_positive() {
    assert_rule(
        &edit(BASE, &[("head_size = 6", "head_size = 0")]),
        "model.attention.head_size",
        "must be at least 1, found 0",
    );
    assert_rule(
        &edit(GQA, &[("total_kv_heads = 2", "total_kv_heads = 0")]),
        "model.attention.total_kv_heads",
        "must be at least 1, found 0",
    );
}

#[test]
fn rule_dtype_sizes() {
    assert_rule(
        &edit(
            BASE,
            &[(
                "dtype_bytes = 2\n\n[model.mamba]",
                "dtype_bytes = 3\n\n[model.mamba]",
            )],
        ),
        "model.attention.dtype_bytes",
        "dtype size 3 bytes is not one of 1, 2, 4, 8",
    );
    assert_rule(
        &edit(BASE, &[("conv_dtype_bytes = 2", "conv_dtype_bytes = 16")]),
        "model.mamba.conv_dtype_bytes",
        "dtype size 16 bytes is not one of 1, 2, 4, 8",
    );
}

#[test]
fn rule_conv_dims_count_matches_kind() {
    assert_rule(
        &edit(BASE, &[("conv_dims = [2, 2, 4]", "conv_dims = [2, 2]")]),
        "model.mamba.conv_dims",
        "mamba kind \"kda\" has 3 conv sub-projection(s), found 2 conv_dims",
    );
    assert_rule(
        &edit(BASE, &[("kind = \"kda\"", "kind = \"mamba1\"")]),
        "model.mamba.conv_dims",
        "mamba kind \"mamba1\" has 1 conv sub-projection(s), found 3 conv_dims",
    );
}

#[test]
fn rule_conv_dims_positive() {
    assert_rule(
        &edit(BASE, &[("conv_dims = [2, 2, 4]", "conv_dims = [2, 0, 4]")]),
        "model.mamba.conv_dims[1]",
        "must be at least 1, found 0",
    );
}

#[test]
fn rule_mamba2_b_equals_c_and_gdn_q_equals_k() {
    assert_rule(
        &edit(BASE, &[("kind = \"kda\"", "kind = \"mamba2\""), ("[2, 2, 4]", "[4, 2, 4]")]),
        "model.mamba.conv_dims[2]",
        "mamba kind \"mamba2\" splits its conv state as x | B | C with B = C, found B = 2 and C = 4",
    );
    assert_rule(
        &edit(BASE, &[("kind = \"kda\"", "kind = \"gdn\"")]).replace("[2, 2, 4]", "[2, 4, 4]"),
        "model.mamba.conv_dims[1]",
        "mamba kind \"gdn\" splits its conv state as Q | K | V with Q = K, found Q = 2 and K = 4",
    );
}

#[test]
fn rule_mamba_sizes_positive() {
    assert_rule(
        &edit(BASE, &[("conv_rows = 3", "conv_rows = 0")]),
        "model.mamba.conv_rows",
        "must be at least 1, found 0",
    );
    assert_rule(
        &edit(BASE, &[("ssm_state_bytes = 64", "ssm_state_bytes = 0")]),
        "model.mamba.ssm_state_bytes",
        "must be at least 1, found 0",
    );
}

#[test]
fn rule_engine_sizes_positive() {
    assert_rule(
        &edit(BASE, &[("tp_size = 2", "tp_size = 0")]),
        "prefill.tp_size",
        "must be at least 1, found 0",
    );
    assert_rule(
        &edit(
            BASE,
            &[(
                "kernel_block = 4\nlogical_block = 12",
                "kernel_block = 0\nlogical_block = 12",
            )],
        ),
        "decode.kernel_block",
        "must be at least 1, found 0",
    );
    assert_rule(
        &edit(BASE, &[("logical_block = 8", "logical_block = 0")]),
        "prefill.logical_block",
        "must be at least 1, found 0",
    );
    assert_rule(
        &edit(
            BASE,
            &[(
                "logical_block = 12",
                "logical_block = 12\nnum_logical_blocks = 0",
            )],
        ),
        "decode.num_logical_blocks",
        "must be at least 1, found 0",
    );
}

#[test]
fn rule_kernel_divides_logical() {
    assert_rule(
        &edit(
            BASE,
            &[(
                "kernel_block = 4\nlogical_block = 12",
                "kernel_block = 6\nlogical_block = 16",
            )],
        ),
        "decode.kernel_block",
        "kernel block 6 does not divide logical block 16",
    );
}

#[test]
fn rule_conv_channels_split_over_tp() {
    assert_rule(
        &edit(
            BASE,
            &[
                ("tp_size = 2", "tp_size = 4"),
                ("logical_block = 8", "logical_block = 12"),
            ],
        ),
        "model.mamba.conv_dims[0]",
        "2 conv channels do not split evenly over prefill.tp_size = 4",
    );
}

#[test]
fn rule_ssm_state_splits_over_tp() {
    assert_rule(
        &edit(BASE, &[("ssm_state_bytes = 64", "ssm_state_bytes = 65")]),
        "model.mamba.ssm_state_bytes",
        "65 SSM state bytes do not split evenly over prefill.tp_size = 2",
    );
}

#[test]
fn rule_kv_heads_shard_or_replicate_over_tp() {
    // 2 heads at TP4 replicate evenly: accepted.
    assert!(parse_geometry(FILE, GQA).is_ok());
    assert_rule(
        &edit(GQA, &[("total_kv_heads = 2", "total_kv_heads = 6")]),
        "model.attention.total_kv_heads",
        "6 KV heads can be neither sharded nor replicated evenly over decode.tp_size = 4 \
         (one must be a multiple of the other)",
    );
}

#[test]
fn rule_mamba_state_fits_the_padded_page() {
    assert_rule(
        &edit(BASE, &[("logical_block = 8", "logical_block = 4")]),
        "prefill.logical_block",
        "one rank's mamba state at TP 2 (conv 24 + SSM 32 = 56 bytes) does not fit the padded \
         page of 48 bytes (logical block 4 x 12 attention bytes per token); the logical block \
         must be at least 8 tokens",
    );
    assert_rule(
        &edit(
            BASE,
            &[(
                "kernel_block = 4\nlogical_block = 12",
                "kernel_block = 3\nlogical_block = 9",
            )],
        ),
        "decode.logical_block",
        "one rank's mamba state at TP 1 (conv 48 + SSM 64 = 112 bytes) does not fit the padded \
         page of 108 bytes (logical block 9 x 12 attention bytes per token); the logical block \
         must be at least 12 tokens",
    );
}

#[test]
fn rule_page_size_limit() {
    assert_rule(
        &edit(BASE, &[("head_size = 6", "head_size = 100000000")]),
        "prefill.logical_block",
        "one rank's page of 1600000000 bytes (logical block x attention bytes per token, \
         with every kernel page's padding) exceeds the limit of 1073741824 bytes",
    );
}

#[test]
fn rule_prompt_lengths_at_least_one() {
    assert_rule(
        &edit(BASE, &[("prompts = [\"2..=5\", 9]", "prompts = [3, 0]")]),
        "prompts[1]",
        "must be at least 1, found 0",
    );
    assert_rule(
        &edit(BASE, &[("prompts = [\"2..=5\", 9]", "prompts = [-3]")]),
        "prompts[0]",
        "must be at least 1, found -3",
    );
    assert_rule(
        &edit(
            BASE,
            &[("prompts = [\"2..=5\", 9]", "prompts = [\"0..=5\"]")],
        ),
        "prompts[0]",
        "must be at least 1, found 0",
    );
}

#[test]
fn rule_prompt_ranges() {
    assert_rule(
        &edit(BASE, &[("\"2..=5\"", "\"2..39\"")]),
        "prompts[0]",
        "`2..39` is not a range: write \"START..=END\" (inclusive), e.g. \"2..=39\"",
    );
    assert_rule(
        &edit(BASE, &[("\"2..=5\"", "\"9..=3\"")]),
        "prompts[0]",
        "range 9..=3 is empty",
    );
    assert_rule(
        &edit(BASE, &[("\"2..=5\"", "\"1..=200000\"")]),
        "prompts",
        "expands to 200000 prompt lengths, more than the limit of 100000",
    );
    assert_rule(
        &edit(BASE, &[("\"2..=5\", 9", "5000000000")]),
        "prompts[0]",
        "prompt length 5000000000 is larger than 4294967295",
    );
}

#[test]
fn rule_prompt_lengths_unique_and_listed() {
    assert_rule(
        &edit(BASE, &[("\"2..=5\", 9", "\"2..=5\", 4")]),
        "prompts[1]",
        "prompt length 4 is listed twice",
    );
    assert_rule(
        &edit(BASE, &[("prompts = [\"2..=5\", 9]", "prompts = []")]),
        "prompts",
        "is an empty list; leave `prompts` out to use the default sweep",
    );
}

#[test]
fn rule_errors_are_typed() {
    let err = parse_geometry(
        FILE,
        &edit(
            BASE,
            &[(
                "kernel_block = 4\nlogical_block = 12",
                "kernel_block = 5\nlogical_block = 12",
            )],
        ),
    )
    .unwrap_err();
    assert_eq!(
        err.rule(),
        Some(&Rule::KernelDoesNotDivideLogical {
            kernel: 5,
            logical: 12
        })
    );
}

// ---------------------------------------------------------------- serde and syntax errors

#[test]
fn unknown_fields_are_refused_with_their_line() {
    // BASE starts with an empty line; `logical_block = 12` is line 30.
    let text = edit(
        BASE,
        &[("logical_block = 12", "logical_block = 12\ncolour = \"red\"")],
    );
    assert_syntax(&text, 31, &["unknown field `colour`", "kernel_block"]);
    let text = format!("sweep = true\n{BASE}");
    assert_syntax(&text, 1, &["unknown field `sweep`", "description"]);
    let text = edit(BASE, &[("conv_rows = 3", "conv_rows = 3\nconv_kernel = 4")]);
    assert_syntax(&text, 19, &["unknown field `conv_kernel`"]);
}

#[test]
fn unknown_kinds_are_refused() {
    let text = edit(BASE, &[("kind = \"kda\"", "kind = \"mamba3\"")]);
    assert_syntax(&text, 16, &["unknown variant `mamba3`", "`kda`"]);
    let text = edit(
        BASE,
        &[("groups = [\"attention\"", "groups = [\"sliding\"")],
    );
    assert_syntax(&text, 8, &["unknown variant `sliding`"]);
    let text = edit(
        BASE,
        &[(
            "logical_block = 12",
            "logical_block = 12\nlayout = \"BHNLC\"",
        )],
    );
    assert_syntax(&text, 31, &["unknown variant `BHNLC`"]);
    let text = format!("stack = 5\n{BASE}");
    assert_syntax(
        &text,
        1,
        &["integer `5`", "expected \"vllm\" or \"sglang\""],
    );
    let text = format!("stack = \"mooncake\"\n{BASE}");
    assert_syntax(
        &text,
        1,
        &["\"mooncake\"", "expected \"vllm\" or \"sglang\""],
    );
}

#[test]
fn wrong_types_and_missing_fields_are_refused() {
    let text = edit(BASE, &[("tp_size = 2", "tp_size = \"two\"")]);
    assert_syntax(&text, 23, &["tp_size", "expected u32"]);
    let text = edit(BASE, &[("tp_size = 2", "tp_size = -2")]);
    assert_syntax(&text, 23, &["expected u32"]);
    let text = edit(BASE, &[("prompts = [\"2..=5\", 9]", "prompts = [true]")]);
    assert_syntax(
        &text,
        4,
        &["a prompt length or a range string like \"2..=39\""],
    );
    let err = parse_geometry(FILE, &edit(BASE, &[("tp_size = 1\n", "")])).unwrap_err();
    let message = err.to_string();
    assert!(message.starts_with(FILE), "{message}");
    assert!(message.contains("missing field `tp_size`"), "{message}");
}

#[test]
fn toml_syntax_errors_keep_line_and_column() {
    let text = edit(BASE, &[("conv_rows = 3", "conv_rows = = 3")]);
    let err = assert_syntax(&text, 18, &[]);
    match err {
        GeometryError::Syntax { column, detail, .. } => {
            assert_eq!(column, Some(13));
            assert!(detail.contains("conv_rows = = 3"), "{detail}");
        }
        other => panic!("{other:?}"),
    }
}

// ---------------------------------------------------------------- loading

#[test]
fn folders_load_their_toml_files_sorted_by_name() {
    let dir = scratch(module_path!(), "folders");
    fs::write(dir.join("b.toml"), BASE).unwrap();
    fs::write(dir.join("a.toml"), GQA).unwrap();
    fs::write(dir.join("notes.txt"), "not a geometry").unwrap();
    fs::create_dir(dir.join("nested.toml")).unwrap();
    fs::write(dir.join("nested.toml").join("c.toml"), BASE).unwrap();
    let single = dir.join("single.geom");
    fs::write(&single, format!("name = \"z\"\n{BASE}")).unwrap();

    let names: Vec<String> = load_geometries(&[dir.clone(), single])
        .unwrap()
        .into_iter()
        .map(|g| g.name)
        .collect();
    // A folder's own files, then its subfolders (even one named *.toml).
    assert_eq!(names, ["a", "b", "c", "z"]);
}

#[test]
fn folders_are_searched_recursively_and_link_loops_end() {
    let dir = scratch(module_path!(), "recursive");
    fs::write(dir.join("b.toml"), format!("name = \"top-b\"\n{BASE}")).unwrap();
    fs::create_dir_all(dir.join("a/deeper")).unwrap();
    fs::create_dir(dir.join("empty")).unwrap();
    fs::write(dir.join("a/x.toml"), format!("name = \"a-x\"\n{GQA}")).unwrap();
    fs::write(
        dir.join("a/deeper/y.toml"),
        format!("name = \"deep-y\"\n{BASE}"),
    )
    .unwrap();
    // Links back up the tree and to a sibling: every folder is searched once.
    std::os::unix::fs::symlink(&dir, dir.join("a/deeper/up")).unwrap();
    std::os::unix::fs::symlink(dir.join("a"), dir.join("z-again")).unwrap();
    let names: Vec<String> = load_geometries(std::slice::from_ref(&dir))
        .unwrap()
        .into_iter()
        .map(|g| g.name)
        .collect();
    assert_eq!(names, ["top-b", "a-x", "deep-y"]);
    let files = kvgeom::geometry::toml_files_in(&dir).unwrap();
    assert_eq!(files.len(), 3, "{files:?}");
}

#[test]
fn a_folder_holding_only_a_link_loop_to_itself_is_empty() {
    let dir = scratch(module_path!(), "only-a-loop");
    std::os::unix::fs::symlink(&dir, dir.join("self")).unwrap();
    let err = load_geometries(std::slice::from_ref(&dir)).unwrap_err();
    assert!(matches!(err, GeometryError::EmptyFolder { .. }), "{err}");
}

#[test]
fn loading_reports_the_bad_file() {
    let dir = scratch(module_path!(), "bad-file");
    fs::write(dir.join("a.toml"), GQA).unwrap();
    let bad = dir.join("b.toml");
    fs::write(&bad, edit(BASE, &[("layer_slots = 2", "layer_slots = 0")])).unwrap();
    let err = load_geometries(&[dir]).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "{}: model.layer_slots: must be at least 1, found 0",
            bad.display()
        )
    );
}

#[test]
fn loading_refuses_duplicate_names() {
    let dir = scratch(module_path!(), "duplicates");
    let (a, b) = (dir.join("a.toml"), dir.join("b.toml"));
    fs::write(&a, format!("name = \"same\"\n{BASE}")).unwrap();
    fs::write(&b, format!("name = \"same\"\n{GQA}")).unwrap();
    let err = load_geometries(&[dir]).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "{}: geometry name `same` is already used by {}",
            b.display(),
            a.display()
        )
    );
}

#[test]
fn loading_refuses_empty_folders_and_missing_paths() {
    let dir = scratch(module_path!(), "empty");
    let err = load_geometries(std::slice::from_ref(&dir)).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("{}: no *.toml geometry files in this folder", dir.display())
    );
    let missing = dir.join("missing.toml");
    let err = load_geometry(&missing).unwrap_err();
    assert!(matches!(err, GeometryError::Read { .. }), "{err:?}");
    assert!(
        err.to_string()
            .starts_with(&format!("{}: cannot read: ", missing.display())),
        "{err}"
    );
}

// ---------------------------------------------------------------- SGLang's stack

const SGLANG: &str = r#"
stack = "sglang"
description = "GQA, 2 KV heads, prefill attention TP1 -> decode TP4"
prompts = [3, 4, 5]

[model]
layers = 2

[model.attention]
kind = "full"
total_kv_heads = 2
head_size = 8
dtype_bytes = 2

[prefill]
tp_size = 1
page_size = 4

[decode]
tp_size = 4
page_size = 4
"#;

/// An SGLang file reads into the shared model: one layer slot per layer,
/// the page as both blocks, the attention TP as the engine's TP, and what
/// only SGLang has (V's head size, each engine's TP) beside it.
#[test]
fn an_sglang_file_reads_into_the_shared_model() {
    use kvgeom::geometry::{SglangSpec, Stack};
    let g = parse_geometry(FILE, SGLANG).expect("parses");
    assert_eq!(g.stack, Stack::Sglang);
    assert_eq!(g.model.layer_slots, 2);
    assert_eq!((g.prefill.kernel_block, g.prefill.logical_block), (4, 4));
    assert_eq!((g.prefill.tp_size, g.decode.tp_size), (1, 4));
    assert_eq!(
        g.sglang,
        Some(SglangSpec {
            v_head_size: None,
            prefill_tp_size: 1,
            decode_tp_size: 4,
            state: None,
        })
    );
    let dp = parse_geometry(
        FILE,
        &edit(
            SGLANG,
            &[("tp_size = 4\n", "tp_size = 8\nattn_tp_size = 4\n")],
        ),
    )
    .expect("DP attention parses");
    assert_eq!(dp.decode.tp_size, 4, "the attention TP shards the KV");
    assert_eq!(dp.sglang.as_ref().map(|s| s.decode_tp_size), Some(8));
    // Written back in SGLang's format, read again equal.
    for g in [g, dp] {
        let text = to_toml(&g);
        assert!(text.starts_with("stack = \"sglang\"\n"), "{text}");
        assert_eq!(
            parse_geometry(FILE, &text).expect("round trip"),
            g,
            "{text}"
        );
    }
}

/// What SGLang's pools cannot hold is refused naming the field as the
/// SGLang file names it.
#[test]
fn an_sglang_file_is_refused_naming_its_own_fields() {
    // (edits of the base file, the field named, the rule's words)
    type Refused<'a> = (&'a [(&'a str, &'a str)], &'a str, &'a str);
    let cases: [Refused; 7] = [
        (
            &[("page_size = 4\n\n[decode]", "page_size = 0\n\n[decode]")],
            "prefill.page_size",
            "must be at least 1",
        ),
        (
            &[("layers = 2", "layers = 0")],
            "model.layers",
            "must be at least 1",
        ),
        (
            &[("tp_size = 4\n", "tp_size = 4\nattn_tp_size = 3\n")],
            "decode.attn_tp_size",
            "attention TP 3 does not divide TP 4",
        ),
        (
            &[(
                "total_kv_heads = 2\nhead_size = 8",
                "head_size = 8\nv_head_size = 8",
            )],
            "model.attention.total_kv_heads",
            "",
        ),
        (
            &[(
                "kind = \"full\"\ntotal_kv_heads = 2\nhead_size = 8",
                "kind = \"mla\"\nhead_size = 8\nv_head_size = 4",
            )],
            "model.attention.v_head_size",
            "MLA has no separate V",
        ),
        (
            &[("total_kv_heads = 2", "total_kv_heads = 3")],
            "model.attention.total_kv_heads",
            "",
        ),
        (
            &[
                ("tp_size = 4\n", "tp_size = 8\nattn_tp_size = 8\n"),
                ("total_kv_heads = 2", "total_kv_heads = 3"),
            ],
            "model.attention.total_kv_heads",
            "",
        ),
    ];
    for (edits, field, rule) in cases {
        let err = parse_geometry(FILE, &edit(SGLANG, edits)).expect_err("refused");
        assert_eq!(err.field(), Some(field), "{err}");
        assert!(err.to_string().contains(rule), "{err}");
    }
    // A field of vLLM's format is not one of SGLang's.
    let err = parse_geometry(
        FILE,
        &edit(
            SGLANG,
            &[("page_size = 4\n\n[decode]", "kernel_block = 4\n\n[decode]")],
        ),
    )
    .expect_err("refused");
    assert!(err.to_string().contains("kernel_block"), "{err}");
    // Nor is a stack kvgeom does not know.
    let err = parse_geometry(
        FILE,
        &edit(SGLANG, &[("stack = \"sglang\"", "stack = \"tgi\"")]),
    )
    .expect_err("refused");
    assert!(err.to_string().contains("tgi"), "{err}");
}

/// kvgeom's connector skips SGLang's files in a folder with one line, runs
/// the rest as before, and refuses a command naming only SGLang's.
#[test]
fn kvgeoms_connector_skips_sglang_files_with_one_line() {
    let dir = scratch(module_path!(), "mixed-stacks");
    fs::copy(
        geometries_dir().join("g1-mla-kda-ppl3-vs-2.toml"),
        dir.join("g1.toml"),
    )
    .unwrap();
    let sweep = |path: &Path| {
        crate::support::kvgeom(&[
            "sweep",
            path.to_str().unwrap(),
            "--prompts",
            "2..=4",
            "--format",
            "json",
        ])
    };
    let alone = crate::support::json_report(&sweep(&dir));
    fs::copy(
        geometries_dir().join("sglang/gqa-2heads-p1-d4.toml"),
        dir.join("sglang.toml"),
    )
    .unwrap();
    let out = sweep(&dir);
    assert_eq!(out.status.code(), Some(0), "{}", crate::support::text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr.matches("1 SGLang geometries skipped").count(),
        1,
        "{stderr}"
    );
    assert_eq!(crate::support::json_report(&out)["cases"], alone["cases"]);
    let only = sweep(&dir.join("sglang.toml"));
    assert_eq!(only.status.code(), Some(2));
    assert!(crate::support::text(&only).contains("every geometry named is SGLang's"));
    let explain = crate::support::kvgeom(&[
        "explain",
        dir.join("sglang.toml").to_str().unwrap(),
        "--prompt",
        "4",
    ]);
    assert_eq!(explain.status.code(), Some(2));
    assert!(crate::support::text(&explain).contains("stack = \"sglang\""));
    let _ = fs::remove_dir_all(&dir);
}
