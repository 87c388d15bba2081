//! The default sweep as the test suite runs it (`sweep_default.rs`,
//! `expectations.rs`).

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use kvgeom::scenario::Case;
use kvgeom::sweep::plan;
use kvgeom::variant::Variant;

/// `geometries/`, the default of `kvgeom sweep`.
pub fn geometries_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("geometries")
}

/// Every shipped geometry of vLLM's stack (what kvgeom's connector runs),
/// `geometries/models/` included.
pub fn geometries() -> Vec<plan::SourcedGeometry> {
    crate::support::vllm_stack(plan::load_sources(&[geometries_root()]).unwrap())
}

/// Whether the file lies in `geometries/` itself (not in a subfolder).
pub fn in_root(src: &plan::SourcedGeometry) -> bool {
    src.file.as_deref().and_then(Path::parent) == Some(geometries_root().as_path())
}

/// The default sweep's grid as the test suite runs it: every case of the
/// files in `geometries/` itself, and of each file below it (the derived
/// pairs at real model scale, seconds per case in a debug build) the middle
/// prompt of its list in both modes with the mainline allocation
/// (`plan::sampled_grid`, the sample `kvgeom mutants` runs too). `.ci/run`
/// sweeps those in full on a release build.
pub fn default_grid(variant: Variant) -> Vec<Case> {
    let sources = geometries();
    assert!(sources.iter().any(in_root) && !sources.iter().all(in_root));
    for src in sources.iter().filter(|s| !in_root(s)) {
        assert!(
            src.geometry.prompts.is_some(),
            "derived pairs list their prompts"
        );
    }
    plan::sampled_grid(
        &sources,
        &plan::PlanOptions {
            variant,
            ..plan::PlanOptions::default()
        },
        |src| plan::in_subfolder(&[geometries_root()], src),
    )
}
