//! Judging SGLang's own P/D KV transfer (`kvgeom sweep --connector
//! sglang`): kvgeom's model of SGLang's pools ([`layout`]), the memory it
//! prepares and expects ([`images`]), the driver's batch and results
//! ([`batch`], [`result`]), what a case takes of the memory budget
//! ([`memory`]), the oracles over a run ([`oracles`]; written
//! here because kvgeom's vLLM layout model does not describe SGLang's
//! pools), SGLang as a connector under test ([`connector`]: place, run the
//! driver's batch, hand each record to the judge), the judging of a run
//! ([`run`]) and its cases recorded as traces ([`trace_file`]).
//! docs/sglang.md describes it for users.

pub mod batch;
pub mod connector;
pub mod error;
pub mod final_memory;
pub mod images;
pub mod layout;
pub mod memory;
pub mod oracles;
pub mod python;
pub mod result;
pub mod run;
pub mod state;
pub mod trace_file;

/// The tests' smallest SGLang case: one layer of full attention, two KV
/// heads, TP 1 and page size 4 on both engines, pushed, as the file
/// `geometries/sglang/x.toml` would give it.
#[cfg(test)]
pub(crate) fn one_layer_test_case(prompt_len: u32, seed: u64) -> crate::scenario::Case {
    let g = crate::geometry::parse_geometry(
        "x.toml",
        "stack = \"sglang\"\ndescription = \"d\"\n[model]\nlayers = 1\n[model.attention]\n\
         kind = \"full\"\ntotal_kv_heads = 2\nhead_size = 8\ndtype_bytes = 2\n\
         [prefill]\ntp_size = 1\npage_size = 4\n[decode]\ntp_size = 1\npage_size = 4\n",
    )
    .expect("geometry");
    crate::scenario::Case {
        geometry: std::sync::Arc::new(g),
        file: Some("geometries/sglang/x.toml".into()),
        prompt_len,
        prefix_hit: 0,
        mode: crate::geometry::Mode::Push,
        allocation: crate::scheduler::DecodeAllocation::Mainline,
        seed,
        variant: crate::variant::Variant::KVGEOM,
    }
}
