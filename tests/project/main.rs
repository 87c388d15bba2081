//! The project itself: the layer table checked against `src/`, `kvgeom
//! derive` against vLLM 0.33.0's and SGLang 0.5.23's own code, and the
//! install script's dependency filter against vLLM's release wheels.

#[path = "../support/mod.rs"]
mod support;

mod architecture;
mod derive;
mod derive_sglang;
mod wheel_deps;
