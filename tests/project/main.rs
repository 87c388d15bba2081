//! The project itself: the layer table checked against `src/`, and `kvgeom
//! derive` against vLLM 0.33.0's and SGLang 0.5.23's own code.

#[path = "../support/mod.rs"]
mod support;

mod architecture;
mod derive;
mod derive_sglang;
