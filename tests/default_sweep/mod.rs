//! The default sweep as the test suite runs it (`sweep_default.rs`,
//! `expectations.rs`).

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use kvgeom::scenario::Case;
use kvgeom::scheduler::DecodeAllocation;
use kvgeom::sweep::plan;
use kvgeom::variant::Variant;

/// `geometries/`, the default of `kvgeom sweep`.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("geometries")
}

/// Every shipped geometry, `geometries/models/` included.
pub fn geometries() -> Vec<plan::SourcedGeometry> {
    plan::load_sources(&[root()]).unwrap()
}

/// Whether the file lies in `geometries/` itself (not in a subfolder).
pub fn in_root(src: &plan::SourcedGeometry) -> bool {
    src.file.as_deref().and_then(Path::parent) == Some(root().as_path())
}

/// The default sweep's grid as the test suite runs it: every case of the
/// files in `geometries/` itself, and of each file below it (the derived
/// pairs at real model scale, seconds per case in a debug build) the middle
/// prompt of its list in both modes with the mainline allocation. `.ci/run`
/// sweeps those in full on a release build.
pub fn default_grid(variant: Variant) -> Vec<Case> {
    let sources = geometries();
    let (top, nested): (Vec<_>, Vec<_>) = sources.into_iter().partition(in_root);
    assert!(!top.is_empty() && !nested.is_empty());
    let mut cases = plan::grid(
        &top,
        &plan::PlanOptions {
            variant,
            ..plan::PlanOptions::default()
        },
    );
    for src in &nested {
        let prompts = src
            .geometry
            .prompts
            .clone()
            .expect("derived pairs list their prompts");
        cases.extend(plan::grid(
            std::slice::from_ref(src),
            &plan::PlanOptions {
                prompts: Some(vec![prompts[prompts.len() / 2]]),
                allocations: Some(vec![DecodeAllocation::Mainline]),
                variant,
                ..plan::PlanOptions::default()
            },
        ));
    }
    cases
}
