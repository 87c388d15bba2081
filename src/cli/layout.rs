//! `kvgeom layout`.

use std::path::Path;

use super::{VariantArgs, EXIT_BAD_INPUT, EXIT_OK};
use crate::derive::load_geometry_file;
use crate::geometry::Mode;
use crate::report::layout_tables::layout_tables;

/// Print `path`'s descriptor tables in each of `modes` under the chosen
/// connector variant.
pub fn layout(path: &Path, modes: &[Mode], variant: &VariantArgs) -> u8 {
    let policy = match variant.variant() {
        Ok(v) => v.policy(),
        Err(code) => return code,
    };
    match load_geometry_file(path) {
        Ok(g) => {
            for (i, &mode) in modes.iter().enumerate() {
                if i > 0 {
                    println!();
                }
                print!("{}", layout_tables(&g, mode, policy));
            }
            EXIT_OK
        }
        Err(e) => {
            eprintln!("error: {e}");
            EXIT_BAD_INPUT
        }
    }
}
