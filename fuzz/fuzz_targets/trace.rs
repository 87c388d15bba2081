//! Arbitrary bytes through the vLLM trace reader, case extraction and the
//! descriptor-level check: an error or a result, never a panic.
#![no_main]

use kvgeom::generate::targets;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| targets::trace(data));
