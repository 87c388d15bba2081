//! The connector under test: what ran and the release table that judges it.

mod code;
pub use code::*;
