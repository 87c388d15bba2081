//! Where an installed `kvgeom` finds the checkout's files. A command's
//! default inputs (`geometries/`, the benchmark geometries) are paths
//! relative to a kvgeom checkout: taken from the current folder when it
//! holds them, else from the checkout the binary was built from (recorded at
//! build time), so `cargo install --path .` works from any folder as long as
//! that checkout stays. The driver side (`vllm-driver/`, `.vllm-venv/`, the
//! pinned expectations) falls back the same way in `live::python::project_root`.

use std::path::{Path, PathBuf};

/// The checkout the binary was built from.
const BUILT_FROM: &str = env!("CARGO_MANIFEST_DIR");

/// A default input that is neither in the current folder nor in the
/// checkout the binary was built from.
#[derive(Debug, thiserror::Error)]
#[error(
    "{} not found here nor in the checkout kvgeom was built from ({}): run kvgeom in a kvgeom checkout, or name the files",
    relative.display(),
    built_from.display()
)]
pub(crate) struct NotInCheckout {
    /// The checkout-relative path looked for.
    pub relative: PathBuf,
    /// The checkout recorded at build time.
    pub built_from: PathBuf,
}

/// `relative` itself when it exists (relative to the current folder), else
/// the same path in the checkout the binary was built from.
pub(crate) fn checkout_path(relative: &str) -> Result<PathBuf, NotInCheckout> {
    resolve(Path::new(relative), Path::new(BUILT_FROM))
}

/// [`checkout_path`] with the fallback checkout given.
fn resolve(relative: &Path, built_from: &Path) -> Result<PathBuf, NotInCheckout> {
    if relative.exists() {
        return Ok(relative.to_path_buf());
    }
    let fallback = built_from.join(relative);
    if fallback.exists() {
        return Ok(fallback);
    }
    Err(NotInCheckout {
        relative: relative.to_path_buf(),
        built_from: built_from.to_path_buf(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_missing_here_is_taken_from_the_build_checkout() {
        // Tests run in the checkout's root, which has no `cli/` of its own.
        let built_from = Path::new(BUILT_FROM).join("src");
        let found = resolve(Path::new("cli/checkout.rs"), &built_from).unwrap();
        assert_eq!(found, built_from.join("cli/checkout.rs"));
    }

    #[test]
    fn a_path_present_here_is_kept_as_given() {
        // Tests run in the checkout: its own geometries/ is found as given.
        assert_eq!(
            checkout_path("geometries").unwrap(),
            Path::new("geometries")
        );
    }

    #[test]
    fn a_path_found_nowhere_names_both_places_in_one_line() {
        let gone = Path::new(BUILT_FROM).join("target/no-such-checkout");
        let error = resolve(Path::new("no-such-geometries"), &gone).unwrap_err();
        let text = error.to_string();
        assert!(!text.contains('\n'), "{text}");
        assert!(
            text.starts_with("no-such-geometries not found here"),
            "{text}"
        );
        assert!(text.contains(&gone.display().to_string()), "{text}");
        assert!(text.contains("run kvgeom in a kvgeom checkout"), "{text}");
    }
}
