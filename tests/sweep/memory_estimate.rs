//! The memory estimate of a case (`scenario::estimate_memory`, what
//! `--max-memory` budgets with) against the memory the case really takes,
//! as the kernel counts this process's peak resident set: within 10 % on
//! cases large enough for the arenas to dominate. The peak is measured as
//! `kvgeom bench scale` measures it (`bench::scale::peak_of`).

use kvgeom::bench::scale::peak_of;
use kvgeom::scenario::{estimate_memory, run_case, RunOptions};
use kvgeom::sweep::plan;

use crate::support::{root, skip};

fn check(file: &str, prompt: u32) {
    let path = root().join(file);
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
    let (passed, peak) = peak_of(|| run_case(case, &RunOptions::default()).passed());
    let Some(peak) = peak else {
        skip(
            "the_estimate_is_within_ten_percent_of_the_allocated_peak",
            "no /proc/self/status to read the peak resident set from",
        );
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
