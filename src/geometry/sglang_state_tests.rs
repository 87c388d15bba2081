//! `[model.state]` of SGLang geometries read and written back through the
//! file format (a file of its own: the format's reader imports
//! `sglang_state`, so its tests cannot live there without a cycle).

use crate::geometry::{parse_geometry, to_toml};

const FILE: &str = r#"
stack = "sglang"
description = "hybrid"
[model]
layers = 4
[model.attention]
kind = "full"
total_kv_heads = 2
head_size = 8
dtype_bytes = 2
[model.state]
kind = "mamba2"
layers = [0, 1, 3]
conv_kernel = 4
n_groups = 2
ssm_state_size = 8
num_heads = 8
head_dim = 4
[prefill]
tp_size = 1
page_size = 4
[decode]
tp_size = 2
page_size = 4
"#;

#[test]
fn a_state_reads_and_writes_back() {
    let g = parse_geometry("h.toml", FILE).expect("valid");
    assert!(g.sglang.as_ref().and_then(|s| s.state.as_ref()).is_some());
    assert_eq!(parse_geometry("h.toml", &to_toml(&g)).expect("again"), g);
}

#[test]
fn bad_states_are_refused_naming_model_state() {
    for (from, to) in [
        ("kind = \"mamba2\"", "kind = \"rwkv\""),
        ("n_groups = 2", "num_v_heads = 2"),
        ("layers = [0, 1, 3]", "layers = [0, 1, 2, 3]"),
        ("layers = [0, 1, 3]", "layers = [0, 9]"),
        ("num_heads = 8", "num_heads = 7"),
        ("n_groups = 2", "n_groups = 3"),
        ("conv_kernel = 4", "conv_kernel = 1"),
    ] {
        let text = FILE.replace(from, to);
        let e = parse_geometry("h.toml", &text).expect_err(to).to_string();
        assert!(e.contains("model.state") || e.contains("kind"), "{to}: {e}");
    }
}
