//! Prompt lengths of a sweep: the default residue sweep of a geometry, and
//! the lists a user gives (parsed by `scenario::prompt_list`).

pub use crate::scenario::prompt_list::parse_prompt_list;

use crate::geometry::Geometry;
use crate::limits::MAX_PROMPTS;

/// How many lengths the default sweep of `geometry` runs.
pub fn default_prompt_count(geometry: &Geometry) -> u64 {
    let (p, d) = (&geometry.prefill, &geometry.decode);
    u64::from(p.logical_block.max(d.logical_block))
        + u64::from(p.kernel_block.max(d.kernel_block))
        + 1
}

/// A geometry without a prompt list whose default sweep is too long.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "{file}: without a `prompts` list the default sweep runs every length from 1 to {count} \
     (one past the largest logical plus kernel block), more than the limit of {limit} prompt \
     lengths; list the lengths to run in `prompts` or give --prompts"
)]
pub struct DefaultSweepTooLong {
    pub file: String,
    pub count: u64,
    pub limit: u64,
}

/// Refuse a geometry whose default sweep would exceed the prompt limit,
/// unless explicit lengths replace it.
pub fn check_default_sweep(
    file: &str,
    geometry: &Geometry,
    explicit: bool,
) -> Result<(), DefaultSweepTooLong> {
    let count = default_prompt_count(geometry);
    if explicit || geometry.prompts.is_some() || count <= MAX_PROMPTS {
        return Ok(());
    }
    Err(DefaultSweepTooLong {
        file: file.to_string(),
        count,
        limit: MAX_PROMPTS,
    })
}

/// The default sweep: every N from 1 up to one past the largest logical
/// block plus the largest kernel block, which covers every residue of every
/// block size of the pair and crosses a block boundary of each.
pub fn default_prompts(geometry: &Geometry) -> Vec<u32> {
    let (p, d) = (&geometry.prefill, &geometry.decode);
    let bound = p.logical_block.max(d.logical_block) + p.kernel_block.max(d.kernel_block) + 1;
    (1..=bound).collect()
}

/// The prompt lengths to run for `geometry`: an explicit list, the file's
/// own list, or the default sweep.
pub fn prompts_for(geometry: &Geometry, explicit: Option<&[u32]>) -> Vec<u32> {
    match (explicit, &geometry.prompts) {
        (Some(list), _) => list.to_vec(),
        (None, Some(list)) => list.clone(),
        (None, None) => default_prompts(geometry),
    }
}
