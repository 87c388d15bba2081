//! The memory estimate of a case (`scenario::estimate_memory`, what
//! `--max-memory` budgets with) against the memory the case really takes,
//! as the kernel counts this process's peak resident set: within 10 % on
//! cases large enough for the arenas to dominate.

use std::path::PathBuf;

use kvgeom::scenario::{estimate_memory, run_case, RunOptions};
use kvgeom::sweep::plan;

/// A field of `/proc/self/status` in bytes (`VmHWM`: peak resident, `VmRSS`: now).
fn status_bytes(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Peak resident bytes above the level before `f` ran, as the kernel counts
/// them: the peak mark is reset first (`/proc/self/clear_refs`), so what
/// `f` allocates and touches is what rises. `None` off Linux.
fn peak_of(f: impl FnOnce()) -> Option<u64> {
    std::fs::write("/proc/self/clear_refs", "5").ok()?;
    let base = status_bytes("VmRSS:")?;
    f();
    Some(status_bytes("VmHWM:")?.saturating_sub(base))
}

fn check(file: &str, prompt: u32) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(file);
    let sources = plan::load_sources(&[path]).unwrap();
    let cases = plan::grid(
        &sources,
        &plan::PlanOptions {
            prompts: Some(vec![prompt]),
            modes: vec![kvgeom::geometry::Mode::Pull],
            allocations: Some(vec![kvgeom::scheduler::DecodeAllocation::Mainline]),
            ..plan::PlanOptions::default()
        },
    );
    let case = &cases[0];
    let estimate = estimate_memory(case).peak_bytes as f64;
    let mut passed = false;
    let Some(peak) = peak_of(|| passed = run_case(case, &RunOptions::default()).passed()) else {
        println!("skipped: no /proc/self/status to read the peak resident set from");
        return;
    };
    let peak = peak as f64;
    assert!(passed, "{file} N={prompt} must pass");
    let error = (estimate - peak).abs() / peak;
    println!(
        "{file} N={prompt}: estimate {estimate} bytes, measured peak {peak} bytes ({:.1} %)",
        error * 100.0
    );
    assert!(
        error <= 0.10,
        "{file} N={prompt}: estimate {estimate} vs peak {peak}"
    );
}

#[test]
fn the_estimate_is_within_ten_percent_of_the_allocated_peak() {
    // One test, so nothing else runs in this process while it measures.
    check("geometries/g6-kimi-linear-scale.toml", 262144);
    check("geometries/deepseek-mla.toml", 20000);
    // 2 of 8 prefill ranks read: the other six are allocated but never touched.
    check("bench/scale/deepseek-v3-p8-d2-16k.toml", 512);
}
