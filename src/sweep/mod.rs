//! Many cases: enumeration (grid from geometry files, seeded random draws),
//! parallel execution, shrinking a failure to a minimal replay, and
//! comparing a run with the same cases on host memory.

pub mod batch_shrink;
pub mod budget;
pub mod compare;
pub mod execute;
pub mod mutants;
pub mod plan;
pub(crate) mod prompts;
pub mod shard;
