//! Many cases: enumeration (grid from geometry files, seeded random draws),
//! parallel execution, shrinking a failure to a minimal replay, and
//! comparing a run with the same cases on host memory.

#[allow(missing_docs)]
pub mod compare;
pub mod execute;
#[allow(missing_docs)]
pub mod expectations;
#[allow(missing_docs)]
pub mod mutants;
#[allow(missing_docs)]
pub mod plan;
pub(crate) mod prompts;
