//! Where the drivers are: the project root holding `vllm-driver/` and
//! `sglang-driver/`.

use std::path::PathBuf;

/// The project root: the current directory when it holds the drivers,
/// else the source tree kvgeom was built from.
pub fn project_root() -> PathBuf {
    let cwd = PathBuf::from(".");
    if cwd.join("vllm-driver").join("driver.py").is_file() {
        return cwd;
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}
