//! The memory estimate of a case (`scenario::estimate_memory`, what
//! `--max-memory` budgets with) against the memory the case really takes,
//! as the kernel counts this process's peak resident set: within 10 % on
//! cases large enough for the arenas to dominate. The peak is measured as
//! `kvgeom bench scale` measures it (`bench::scale::peak_of`), in a child
//! process that runs this test alone.

use kvgeom::bench::scale::peak_of;
use kvgeom::scenario::{estimate_memory, RunOptions};
use kvgeom::sweep::plan;
use kvgeom::under_test::run_case;

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

/// Set in the child process that measures, alone.
const ALONE: &str = "KVGEOM_MEASURE_ALONE";

#[test]
fn the_estimate_is_within_ten_percent_of_the_allocated_peak() {
    let name = "memory_estimate::the_estimate_is_within_ten_percent_of_the_allocated_peak";
    if std::env::var_os(ALONE).is_none() {
        // The peak is the whole process's: the other tests of this binary
        // run beside this one, so it measures in a child process of its own
        // that runs only this test.
        let out = std::process::Command::new(std::env::current_exe().expect("the test binary"))
            .args([name, "--exact", "--nocapture", "--test-threads=1"])
            .env(ALONE, "1")
            .output()
            .expect("the test binary runs");
        print!("{}", String::from_utf8_lossy(&out.stdout));
        assert!(
            out.status.success() && String::from_utf8_lossy(&out.stdout).contains("1 passed"),
            "the measuring run failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        return;
    }
    check("geometries/g6-kimi-linear-scale.toml", 262144);
    check("geometries/deepseek-mla.toml", 20000);
    // 2 of 8 prefill ranks read: the other six are allocated but never touched.
    check("bench/scale/deepseek-v3-p8-d2-16k.toml", 512);
}
