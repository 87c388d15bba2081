//! Arbitrary bytes through the geometry TOML loader: an error or a geometry
//! that `to_toml` writes back unchanged, never a panic.
#![no_main]

use kvgeom::generate::targets;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| targets::geometry_file(data));
