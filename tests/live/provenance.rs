//! What ran: an interpreter's vLLM with a file that differs from its
//! RECORD hash is reported as modified and judged as no release (no
//! expectations, the plan comparison information only). Needs only a
//! `python3` (the vLLM here is a package built by the test).

use std::path::{Path, PathBuf};

use kvgeom::live;
use kvgeom::under_test::{CodeUnderTest, Release};

use crate::support::{python_with_site, scratch, skip};

/// A site folder with a `vllm` package at `version` whose `worker.py`
/// differs from its RECORD hash when `modified`.
fn fake_site(dir: &Path, version: &str, modified: bool) -> PathBuf {
    let site = dir.join("site");
    let pkg = site.join("vllm");
    std::fs::create_dir_all(&pkg).unwrap();
    std::fs::write(pkg.join("__init__.py"), b"").unwrap();
    // sha256 of the empty file, as RECORD writes it.
    let empty = "sha256=47DEQpj8HBSa-_TImW-5JCeuQeRkm5NMpJWZG3hSuFU";
    std::fs::write(pkg.join("worker.py"), if modified { "x = 1\n" } else { "" }).unwrap();
    let info = site.join(format!("vllm-{version}.dist-info"));
    std::fs::create_dir_all(&info).unwrap();
    std::fs::write(
        info.join("METADATA"),
        format!("Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n"),
    )
    .unwrap();
    std::fs::write(
        info.join("RECORD"),
        format!(
            "vllm/__init__.py,{empty},0\nvllm/worker.py,{empty},0\n\
             vllm-{version}.dist-info/METADATA,,\nvllm-{version}.dist-info/RECORD,,\n"
        ),
    )
    .unwrap();
    site
}

/// `python3` from PATH, if there is one.
fn python3() -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join("python3"))
            .find(|p| p.is_file())
    })
}

#[test]
fn a_vllm_with_a_file_unlike_its_record_is_reported_modified_and_is_no_release() {
    let test = "a_vllm_with_a_file_unlike_its_record_is_reported_modified_and_is_no_release";
    let pinned = Release::pinned().version;
    for modified in [false, true] {
        let dir = scratch(module_path!(), &format!("modified-{modified}"));
        let site = fake_site(&dir, pinned, modified);
        let Some(python3) = python3() else {
            return skip(test, "no python3 on PATH");
        };
        let python = python_with_site(&dir, &site, &python3.to_string_lossy());
        let found = live::find(Some(&python), pinned).expect("the probe reads the package");
        let code = found.code_under_test();
        if modified {
            assert_eq!(found.provenance.modified_files, ["vllm/worker.py"]);
            assert_eq!(code.describe(), format!("vLLM {pinned}, modified: 1 file"));
            assert!(code.release().is_none());
            assert_eq!(code.reference_policy(), None);
            assert_eq!(code.expectations(), None);
        } else {
            assert!(found.provenance.modified_files.is_empty());
            assert_eq!(code, CodeUnderTest::vllm(pinned));
            assert!(code.release().is_some());
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn a_vllm_overlaid_on_pythonpath_is_compared_file_by_file_and_reported_modified() {
    let test = "a_vllm_overlaid_on_pythonpath_is_compared_file_by_file_and_reported_modified";
    let pinned = Release::pinned().version;
    let Some(python3) = python3() else {
        return skip(test, "no python3 on PATH");
    };
    // The venv's release, unmodified, and before it on PYTHONPATH a bare
    // `vllm` package (no dist-info): a branch's worker.py and a file the
    // release does not have. Python imports the overlay; the distribution
    // found is still the release's.
    let dir = scratch(module_path!(), "overlay");
    let site = fake_site(&dir, pinned, false);
    let overlay = dir.join("overlay").join("vllm");
    std::fs::create_dir_all(&overlay).unwrap();
    std::fs::write(overlay.join("__init__.py"), b"").unwrap();
    std::fs::write(overlay.join("worker.py"), "branch = True\n").unwrap();
    std::fs::write(overlay.join("pairing.py"), "").unwrap();
    let path = PathBuf::from(format!(
        "{}:{}",
        dir.join("overlay").display(),
        site.display()
    ));
    let python = python_with_site(&dir, &path, &python3.to_string_lossy());
    let found = live::find(Some(&python), pinned).expect("the probe reads the package");
    assert_eq!(
        found.provenance.modified_files,
        ["vllm/pairing.py (not in RECORD)", "vllm/worker.py"]
    );
    let code = found.code_under_test();
    assert!(
        code.release().is_none(),
        "an overlaid release is not the release"
    );
    assert_eq!(code.describe(), format!("vLLM {pinned}, modified: 2 files"));
    // The same overlay with the release's own bytes is the release.
    std::fs::write(overlay.join("worker.py"), "").unwrap();
    std::fs::remove_file(overlay.join("pairing.py")).unwrap();
    let found = live::find(Some(&python), pinned).expect("the probe reads the package");
    assert!(
        found.provenance.modified_files.is_empty(),
        "{:?}",
        found.provenance.modified_files
    );
    let _ = std::fs::remove_dir_all(&dir);
}
