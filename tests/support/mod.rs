//! What the integration-test binaries share. Each includes this module
//! (`#[path = "../support/mod.rs"] mod support;`) and uses what it needs.

#![allow(dead_code)]

pub mod harness;
pub mod transport_scenarios;
