//! vLLM traces: v1 fixtures read, checked, explained and fuzzed with broken
//! input; v2 traces of the live driver judged.

#[path = "../support/mod.rs"]
mod support;

mod trace_check;
mod trace_explain;
mod trace_reader;
mod trace_robustness;
mod trace_sglang;
mod trace_v2;
mod trace_v2_releases;
