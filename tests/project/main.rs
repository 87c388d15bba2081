//! The project itself: the layer table checked against `src/`, and `kvgeom
//! derive` against vLLM 0.33.0's own functions.

#[path = "../support/mod.rs"]
mod support;

mod architecture;
mod derive;
