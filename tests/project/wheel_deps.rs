//! `scripts/vllm-wheel-deps.py`, the filter `install-vllm.sh --version X`
//! applies to a vLLM wheel's requirements, against the stored
//! `Requires-Dist` lines of every release wheel 0.30.0-0.34.0
//! (tests/fixtures/vllm-wheel-requires/), without network; and its choice
//! of a version for a pin the package index lacks. Needs only a `python3`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::support::{root, skip};

const RELEASES: [&str; 5] = ["0.30.0", "0.31.0", "0.32.0", "0.33.0", "0.34.0"];

/// `python3` from PATH, if there is one.
fn python3() -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join("python3"))
            .find(|p| p.is_file())
    })
}

fn wheel_deps(python: &Path, args: &[&str]) -> Output {
    Command::new(python)
        .arg(root().join("scripts/vllm-wheel-deps.py"))
        .args(args)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .expect("python3 starts")
}

/// A requirement's project name as the filter compares it.
fn canonical(requirement: &str) -> String {
    let end = requirement
        .find(|c: char| "[<>=!~; (".contains(c))
        .unwrap_or(requirement.len());
    requirement[..end].to_lowercase().replace(['_', '.'], "-")
}

/// What the filter makes of one release: (kind, requirement) for stdout's
/// `torch` / `dep` / `nodeps` lines, and the names stderr says it skips.
fn filtered(python: &Path, release: &str) -> (Vec<(String, String)>, Vec<String>, Vec<String>) {
    let fixture = root().join(format!(
        "tests/fixtures/vllm-wheel-requires/vllm-{release}.txt"
    ));
    let stored: Vec<String> = std::fs::read_to_string(&fixture)
        .unwrap_or_else(|e| panic!("{}: {e}", fixture.display()))
        .lines()
        .filter_map(|l| l.strip_prefix("Requires-Dist:"))
        .map(|r| canonical(r.trim()))
        .collect();
    assert!(
        stored.len() > 80,
        "{release}: only {} requirements stored",
        stored.len()
    );
    let out = wheel_deps(python, &["--requires", &fixture.to_string_lossy()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{release}: the filter failed:\n{stdout}{stderr}"
    );
    let kept = stdout
        .lines()
        .map(|l| {
            let (kind, req) = l.split_once(' ').expect("`KIND REQUIREMENT` lines");
            (kind.to_owned(), req.to_owned())
        })
        .collect();
    let skipped = stderr
        .lines()
        .filter_map(|l| l.strip_prefix("skip "))
        .map(canonical)
        .collect();
    (kept, skipped, stored)
}

/// Packages the CPU-side import of vLLM's config, KV-cache and NIXL
/// connector modules needs (and the project's tests: pytest).
const NEEDED: [&str; 11] = [
    "transformers",
    "msgspec",
    "pyzmq",
    "numpy",
    "pydantic",
    "cloudpickle",
    "compressed-tensors",
    "flashinfer-python",
    "pytest",
    "loguru",
    "nvidia-ml-py",
];

/// Packages no CPU-side import path of the driver loads: GPU kernels and
/// their compilers, CUDA libraries, the torch family beside torch, ray,
/// numba, the image stack.
fn gpu_only(name: &str) -> bool {
    name != "nvidia-ml-py"
        && (name.starts_with("nvidia-")
            || name.starts_with("cuda-")
            || name.starts_with("triton")
            || [
                "torchvision",
                "torchaudio",
                "torchcodec",
                "ray",
                "numba",
                "tilelang",
                "apache-tvm-ffi",
                "quack-kernels",
                "tokenspeed-mla",
                "humming-kernels",
                "xformers",
                "deep-gemm",
                "mistral-common",
                "opencv-python-headless",
                "pynvvideocodec",
                "nvtx",
                "fastsafetensors",
                "instanttensor",
            ]
            .contains(&name))
}

#[test]
fn the_filter_keeps_what_cpu_import_needs_and_leaves_gpu_packages_out_for_every_release() {
    let test =
        "the_filter_keeps_what_cpu_import_needs_and_leaves_gpu_packages_out_for_every_release";
    let Some(python) = python3() else {
        return skip(test, "no python3 on PATH");
    };
    for release in RELEASES {
        let (kept, skipped, stored) = filtered(&python, release);
        let torch: Vec<_> = kept.iter().filter(|(k, _)| k == "torch").collect();
        assert_eq!(torch.len(), 1, "{release}: one torch line: {kept:?}");
        assert!(
            torch[0].1.starts_with("torch=="),
            "{release}: torch is pinned: {torch:?}"
        );
        let names: Vec<String> = kept.iter().map(|(_, r)| canonical(r)).collect();
        for needed in NEEDED {
            assert!(
                names.iter().any(|n| n == needed),
                "{release}: {needed} (needed by CPU import) is left out: {names:?}"
            );
        }
        for name in &names {
            assert!(!gpu_only(name), "{release}: GPU-only {name} is installed");
        }
        for name in ["torchvision", "numba", "tilelang", "mistral-common"] {
            if stored.iter().any(|s| s == name) {
                assert!(
                    skipped.iter().any(|s| s == name),
                    "{release}: {name} is not reported as left out: {skipped:?}"
                );
            }
        }
        // Nothing is invented: every name comes from the wheel, but for the
        // three the filter always adds.
        for name in names.iter().chain(&skipped) {
            assert!(
                stored.contains(name)
                    || ["pytest", "loguru", "nvidia-ml-py"].contains(&name.as_str()),
                "{release}: {name} is not a requirement of the wheel"
            );
        }
        // FlashInfer and compressed-tensors go in at the wheel's pin,
        // without their GPU dependencies.
        for name in ["flashinfer-python", "compressed-tensors"] {
            let (kind, req) = kept
                .iter()
                .find(|(_, r)| canonical(r) == name)
                .expect("checked above");
            assert_eq!(kind, "nodeps", "{release}: {req}");
            assert!(req.contains("=="), "{release}: {req} is the wheel's pin");
        }
    }
    // The pin that made 0.34.0 uninstallable is the one the fixture holds.
    let (kept, _, _) = filtered(&python, "0.34.0");
    assert!(
        kept.contains(&("nodeps".into(), "flashinfer-python==0.7.3".into())),
        "{kept:?}"
    );
}

#[test]
fn a_pin_the_index_lacks_becomes_the_highest_of_its_minor_else_the_lowest_newer() {
    let test = "a_pin_the_index_lacks_becomes_the_highest_of_its_minor_else_the_lowest_newer";
    let Some(python) = python3() else {
        return skip(test, "no python3 on PATH");
    };
    let chosen = |args: &[&str]| {
        let mut all = vec!["substitute"];
        all.extend_from_slice(args);
        let out = wheel_deps(&python, &all);
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    };
    // 0.34.0's case: the index has 0.7.2.post1 and 0.7.4, no 0.7.3.
    let index = [
        "0.6.18.post1",
        "0.7.0.post1",
        "0.7.2.post1",
        "0.7.4",
        "0.8.0rc1",
    ];
    let mut args = vec!["flashinfer-python==0.7.3"];
    args.extend(index);
    assert_eq!(chosen(&args).as_deref(), Some("flashinfer-python==0.7.4"));
    // An older one of the same minor is taken when it is all there is.
    assert_eq!(
        chosen(&["flashinfer-python==0.7.3", "0.6.0", "0.7.2.post1", "0.8.0"]).as_deref(),
        Some("flashinfer-python==0.7.2.post1")
    );
    // No release of the minor: the lowest newer final release.
    assert_eq!(
        chosen(&["lark==1.2.2", "1.1.9", "1.4.0", "1.3.0", "1.3.1rc1"]).as_deref(),
        Some("lark==1.3.0")
    );
    // Nothing of the minor, nothing newer; or no exact pin: no choice.
    assert_eq!(chosen(&["lark==1.2.2", "1.0.0", "1.1.9"]), None);
    assert_eq!(chosen(&["lark>=1.2.2", "1.3.0"]), None);
}
