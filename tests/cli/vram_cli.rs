//! The `kvgeom` commands of the GPU path as a user runs them: `sweep
//! --memory vram` without a usable GPU, `sweep --compare-host`, and `bench
//! vram` on host memory (in process, and with a peer process when the NIXL
//! runtime loads).

use crate::support::{kvgeom, kvgeom_with_env};

/// `kvgeom bench vram` on host memory: one iteration of G1's 29-token
/// request over `paths`, then `extra`.
fn bench_g1_on_host<'a>(paths: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "bench",
        "vram",
        "--memory",
        "host",
        "--geometry",
        "geometries/g1-mla-kda-ppl3-vs-2.toml",
        "--prompt",
        "29",
        "--iterations",
        "1",
        "--paths",
        paths,
    ];
    args.extend_from_slice(extra);
    args
}

fn utf8(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Whether this build can reach a GPU (then `--memory vram` must work).
fn gpu_usable() -> bool {
    #[cfg(feature = "cuda")]
    {
        kvgeom::memory::CudaDevice::open(0).is_ok()
    }
    #[cfg(not(feature = "cuda"))]
    {
        false
    }
}

#[test]
fn a_vram_sweep_without_a_usable_gpu_exits_2_with_the_reason() {
    let out = kvgeom(&[
        "sweep",
        "--memory",
        "vram",
        "geometries/g1-mla-kda-ppl3-vs-2.toml",
        "--prompts",
        "2..=5",
    ]);
    let stderr = utf8(&out.stderr);
    if gpu_usable() {
        assert_eq!(out.status.code(), Some(0), "{stderr}");
        return;
    }
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let reason = if cfg!(feature = "cuda") {
        "error: no CUDA driver: libcuda.so.1 could not be loaded"
    } else {
        "error: --memory vram needs kvgeom built with `--features cuda` and a CUDA GPU"
    };
    assert!(stderr.starts_with(reason), "{stderr}");
    assert!(out.stdout.is_empty());
}

#[test]
fn compare_host_reports_every_case_equal() {
    let out = kvgeom(&[
        "sweep",
        "--compare-host",
        "geometries/g1-mla-kda-ppl3-vs-2.toml",
        "--prompts",
        "2..=9",
        "--mode",
        "pull",
    ]);
    let stderr = utf8(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert_eq!(
        stderr,
        "compared with host memory over loopback: all 16 cases give the same results\n"
    );
    assert!(utf8(&out.stdout).ends_with("16 passed, 0 failed\n"));
}

#[test]
fn bench_vram_on_host_memory_prints_its_table() {
    let out = kvgeom(&[
        "bench",
        "vram",
        "--memory",
        "host",
        "--geometry",
        "geometries/g6-kimi-linear-scale.toml",
        "--prompt",
        "1537",
        "--iterations",
        "1",
        "--paths",
        "copy,copy-per-pair,loopback",
    ]);
    let stdout = utf8(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", utf8(&out.stderr));
    // What it allocates is said first, on stderr.
    assert!(
        utf8(&out.stderr).starts_with(
            "bench vram geometries/g6-kimi-linear-scale.toml --prompt 1537: allocates about "
        ),
        "{}",
        utf8(&out.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(
        lines[0].starts_with(
            "READ of one 1537-token request of geometries/g6-kimi-linear-scale.toml (host memory): "
        ),
        "{stdout}"
    );
    assert!(lines[1].starts_with("UCX settings: "), "{stdout}");
    assert!(
        lines[2].starts_with("NIXL agents: progress thread delay "),
        "{stdout}"
    );
    assert!(lines[3].starts_with("path "), "{stdout}");
    let paths: Vec<&str> = lines[4..]
        .iter()
        .map(|l| l.split_whitespace().next().unwrap_or_default())
        .collect();
    assert_eq!(paths, ["copy", "copy-per-pair", "loopback"], "{stdout}");
}

#[test]
fn bench_vram_with_a_peer_process_moves_and_checks_the_bytes() {
    let out = kvgeom(&bench_g1_on_host("nixl-peer", &["--peer-process"]));
    let stdout = utf8(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", utf8(&out.stderr));
    let last = stdout.lines().last().unwrap_or_default();
    // Measured where the NIXL runtime loads, skipped with the reason elsewhere.
    assert!(
        last.starts_with("nixl-peer ") || last.starts_with("nixl-peer: skipped: "),
        "{stdout}"
    );
    if !cfg!(feature = "nixl") {
        assert_eq!(
            last,
            "nixl-peer: skipped: built without the `nixl` cargo feature"
        );
    }
}

#[test]
fn bench_vram_with_a_malformed_agent_setting_names_the_variable() {
    let out = kvgeom_with_env(
        &bench_g1_on_host("copy", &[]),
        &[("KVGEOM_NIXL_PROGRESS_DELAY_US", "ten")],
    );
    let stderr = utf8(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("KVGEOM_NIXL_PROGRESS_DELAY_US=\"ten\" is not a non-negative whole number"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}
