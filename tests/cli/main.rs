//! The `kvgeom` binary as a user runs it: exit statuses and report formats,
//! the GPU path's commands, hostile inputs, every command line the
//! documentation shows, and an installed binary run from another folder.

#[path = "../support/mod.rs"]
mod support;

mod cli;
mod conformance;
mod docs_commands;
mod handshake_compat;
mod hostile_inputs;
mod installed_binary;
mod lifecycle;
mod matrix;
mod new_release_script;
mod vram_cli;
