//! The `kvgeom` binary as a user runs it: exit statuses and report formats,
//! the GPU path's commands, and hostile inputs.

#[path = "../support/mod.rs"]
mod support;

mod cli;
mod hostile_inputs;
mod vram_cli;
