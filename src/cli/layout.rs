//! `kvgeom layout`.

use std::path::Path;

use super::{EXIT_BAD_INPUT, EXIT_OK};
use crate::geometry::{load_geometry, Mode};
use crate::report::layout_tables::layout_tables;

pub fn layout(path: &Path, mode: Mode) -> u8 {
    match load_geometry(path) {
        Ok(g) => {
            print!("{}", layout_tables(&g, mode));
            EXIT_OK
        }
        Err(e) => {
            eprintln!("error: {e}");
            EXIT_BAD_INPUT
        }
    }
}
