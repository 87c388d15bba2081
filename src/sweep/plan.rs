//! Enumerating cases: the grid from geometry files x prompt lengths x prefix
//! hits x modes x allocations, or a seeded random draw from the same space.

use std::path::PathBuf;
use std::sync::Arc;

use crate::derive::{load_geometry_file_with_source, ModelSource};
use crate::geometry::{geometry_files, Geometry, GeometryError, Mode};
use crate::scenario::placement::SplitMix;
use crate::scenario::Case;
use crate::scheduler::DecodeAllocation;
use crate::variant::Variant;

use super::prompts::{default_prompts, prompts_for};

/// A geometry and the file it came from.
#[derive(Clone, Debug)]
pub struct SourcedGeometry {
    /// The loaded geometry, shared by every case drawn from it.
    pub geometry: Arc<Geometry>,
    /// The file it came from (`None` for generated geometries).
    pub file: Option<PathBuf>,
    /// The deployment the file states when it names `model.hf_config`
    /// (the model config and each engine's options it was derived from).
    pub model: Option<Arc<ModelSource>>,
}

/// Load files and folders (a folder contributes the `*.toml` files under
/// it, searched recursively: see `geometry::toml_files_in`).
pub fn load_sources(paths: &[PathBuf]) -> Result<Vec<SourcedGeometry>, GeometryError> {
    let mut out = Vec::new();
    for path in paths {
        for file in geometry_files(path)? {
            let (geometry, model) = load_geometry_file_with_source(&file)?;
            if let Some(first) = out
                .iter()
                .find(|s: &&SourcedGeometry| s.geometry.name == geometry.name)
            {
                return Err(GeometryError::DuplicateName {
                    name: geometry.name.clone(),
                    first: first
                        .file
                        .as_ref()
                        .map_or_else(String::new, |f| f.display().to_string()),
                    second: file.display().to_string(),
                });
            }
            out.push(SourcedGeometry {
                geometry: Arc::new(geometry),
                file: Some(file),
                model: model.map(Arc::new),
            });
        }
    }
    Ok(out)
}

/// Which cases to run.
#[derive(Clone, Debug)]
pub struct PlanOptions {
    /// Overrides every geometry's own prompt list.
    pub prompts: Option<Vec<u32>>,
    /// Modes to run; both by default.
    pub modes: Vec<Mode>,
    /// `None`: both allocations for hybrids, mainline otherwise.
    pub allocations: Option<Vec<DecodeAllocation>>,
    /// The connector variant every case runs.
    pub variant: Variant,
    /// Seed of the placement (and of random draws).
    pub seed: u64,
}

impl Default for PlanOptions {
    fn default() -> Self {
        Self {
            prompts: None,
            modes: vec![Mode::Pull, Mode::Push],
            allocations: None,
            variant: Variant::KVGEOM,
            seed: 0,
        }
    }
}

/// Prefix hits to try: none, and with prefix caching on D one and the most
/// whole decode blocks short of the transferred tokens.
pub fn prefix_hits(geometry: &Geometry, prompt_len: u32) -> Vec<u32> {
    let mut hits = vec![0];
    if geometry.decode.prefix_caching {
        let block = geometry.decode.logical_block;
        let m = geometry.transferred_tokens(prompt_len);
        let most = m.saturating_sub(1) / block * block;
        for h in [block, most] {
            if h > 0 && h < m && !hits.contains(&h) {
                hits.push(h);
            }
        }
    }
    hits
}

/// Decode allocations worth running: they differ only for hybrids.
pub fn allocations(
    geometry: &Geometry,
    chosen: &Option<Vec<DecodeAllocation>>,
) -> Vec<DecodeAllocation> {
    match chosen {
        Some(list) => list.clone(),
        None if geometry.model.has_mamba() => {
            vec![DecodeAllocation::Mainline, DecodeAllocation::WithLastToken]
        }
        None => vec![DecodeAllocation::Mainline],
    }
}

/// The full grid.
pub fn grid(sources: &[SourcedGeometry], opts: &PlanOptions) -> Vec<Case> {
    let mut cases = Vec::new();
    for src in sources {
        let g = &src.geometry;
        for prompt_len in prompts_for(g, opts.prompts.as_deref()) {
            for prefix_hit in prefix_hits(g, prompt_len) {
                for &mode in &opts.modes {
                    for allocation in allocations(g, &opts.allocations) {
                        cases.push(Case {
                            geometry: Arc::clone(g),
                            file: src.file.clone(),
                            prompt_len,
                            prefix_hit,
                            mode,
                            allocation,
                            seed: opts.seed,
                            variant: opts.variant,
                        });
                    }
                }
            }
        }
    }
    cases
}

/// `count` cases drawn from the same space with `seed`, each with its own
/// placement seed; prompt lengths range over the default residue sweep.
pub fn random(
    sources: &[SourcedGeometry],
    count: usize,
    seed: u64,
    opts: &PlanOptions,
) -> Vec<Case> {
    let mut rng = SplitMix::new(seed);
    let mut pick = |n: usize| rng.below(n.max(1) as u64) as usize;
    (0..count)
        .filter_map(|_| {
            let src = sources.get(pick(sources.len()))?;
            let g = &src.geometry;
            let prompts = opts.prompts.clone().unwrap_or_else(|| default_prompts(g));
            let prompt_len = prompts[pick(prompts.len())];
            let hits = prefix_hits(g, prompt_len);
            let allocs = allocations(g, &opts.allocations);
            Some(Case {
                geometry: Arc::clone(g),
                file: src.file.clone(),
                prompt_len,
                prefix_hit: hits[pick(hits.len())],
                mode: opts.modes[pick(opts.modes.len())],
                allocation: allocs[pick(allocs.len())],
                seed: pick(u32::MAX as usize) as u64,
                variant: opts.variant,
            })
        })
        .collect()
}

/// Whether `src` lies in a subfolder of one of the folders in `paths` (the
/// derived pairs at real model scale, `geometries/models/` under
/// `geometries/`): the files a sampled grid runs one prompt of.
pub fn in_subfolder(paths: &[PathBuf], src: &SourcedGeometry) -> bool {
    let Some(parent) = src.file.as_deref().and_then(std::path::Path::parent) else {
        return false;
    };
    paths
        .iter()
        .any(|p| p.is_dir() && parent != p.as_path() && parent.starts_with(p))
}

/// The sample of one geometry: the middle prompt of its list (its own, or
/// the default residue sweep), in `opts`'s modes, with the mainline
/// allocation (the default sweep's tests sample the real-scale pairs so).
pub fn sample_options(geometry: &Geometry, opts: &PlanOptions) -> PlanOptions {
    let prompts = prompts_for(geometry, opts.prompts.as_deref());
    PlanOptions {
        prompts: Some(
            prompts
                .get(prompts.len() / 2)
                .map_or_else(Vec::new, |&p| vec![p]),
        ),
        allocations: Some(vec![DecodeAllocation::Mainline]),
        ..opts.clone()
    }
}

/// The grid, with each source for which `sampled` holds reduced to its
/// sample (`sample_options`); sources keep their order.
pub fn sampled_grid(
    sources: &[SourcedGeometry],
    opts: &PlanOptions,
    sampled: impl Fn(&SourcedGeometry) -> bool,
) -> Vec<Case> {
    sources
        .iter()
        .flat_map(|src| {
            let one = std::slice::from_ref(src);
            if sampled(src) {
                grid(one, &sample_options(&src.geometry, opts))
            } else {
                grid(one, opts)
            }
        })
        .collect()
}
