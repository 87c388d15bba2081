//! Many cases: enumeration (grid from geometry files, seeded random draws),
//! parallel execution, and shrinking a failure to a minimal replay.

pub mod execute;
pub mod mutants;
pub mod plan;
pub mod prompts;
