//! The same transfer scenarios through the loopback transport and through
//! real NIXL agents: the bytes that land, the notifications that arrive and
//! every rejection (by error kind) must be identical.
//!
//! Needs the NIXL runtime (`scripts/install-nixl-runtime.sh`, then
//! `source .nixl-runtime/env.sh`); without it every case prints
//! `skipped: <reason>`. Cases run one after another on the main thread
//! (nixl-sys objects are not `Send`, and NIXL may deadlock with parallel
//! tests), so this file has its own `main`. Arguments select cases by name,
//! as with libtest: `cargo test --features nixl --test transport_nixl -- read`.

mod support;

use support::harness;
use support::transport_scenarios as scenarios;

use std::process::ExitCode;

use kvgeom::nixl::real::RealNixl;
use kvgeom::nixl::{Loopback, NixlAgentOptions, NixlError};
use scenarios::Outcome;

type Scenario<T> = fn(&mut T) -> Result<Outcome, String>;

struct Case {
    name: &'static str,
    loopback: Scenario<Loopback>,
    real: Scenario<RealNixl>,
}

macro_rules! case {
    ($name:ident) => {
        Case {
            name: stringify!($name),
            loopback: scenarios::$name::<Loopback>,
            real: scenarios::$name::<RealNixl>,
        }
    };
}

use harness::Verdict;

/// Where the two outcomes first differ, in words.
fn difference(loopback: &Outcome, real: &Outcome) -> Option<String> {
    for (i, (l, r)) in loopback.verdicts.iter().zip(&real.verdicts).enumerate() {
        if l != r {
            return Some(format!(
                "step {i} '{}': loopback {:?}, real NIXL {:?} ('{}')",
                l.0, l.1, r.1, r.0
            ));
        }
    }
    if loopback.verdicts.len() != real.verdicts.len() {
        return Some(format!(
            "{} steps on loopback, {} on real NIXL",
            loopback.verdicts.len(),
            real.verdicts.len()
        ));
    }
    for (i, (l, r)) in loopback.arenas.iter().zip(&real.arenas).enumerate() {
        if let Some(at) = l.iter().zip(r).position(|(a, b)| a != b) {
            return Some(format!(
                "arena {i} differs first at byte {at}: loopback {}, real NIXL {}",
                l[at], r[at]
            ));
        }
        if l.len() != r.len() {
            return Some(format!("arena {i} has different lengths"));
        }
    }
    if loopback.arenas.len() != real.arenas.len() {
        return Some("different numbers of arenas".into());
    }
    if loopback.notifications != real.notifications {
        return Some(format!(
            "notifications differ: loopback {:?}, real NIXL {:?}",
            loopback.notifications, real.notifications
        ));
    }
    None
}

/// The agent settings each case runs with: kvgeom's (from the
/// environment) and vLLM 0.33.0's, whose UCX thread pool posts descriptors
/// through another engine of the UCX backend.
const SETTINGS: [(&str, Option<NixlAgentOptions>); 2] = [
    ("", None),
    (" (vLLM agent settings)", Some(NixlAgentOptions::VLLM)),
];

fn run_case(case: &Case, options: Option<NixlAgentOptions>) -> Verdict {
    let real = match options {
        None => RealNixl::new(),
        Some(options) => RealNixl::with_options(options),
    };
    let mut real = match real {
        Ok(real) => real,
        Err(NixlError::RuntimeUnavailable(reason)) => return Verdict::Skipped(reason),
        Err(e) => return Verdict::Failed(format!("creating the real transport: {e}")),
    };
    let loopback = match (case.loopback)(&mut Loopback::new()) {
        Ok(outcome) => outcome,
        Err(e) => return Verdict::Failed(format!("loopback: {e}")),
    };
    let real = match (case.real)(&mut real) {
        Ok(outcome) => outcome,
        Err(e) => return Verdict::Failed(format!("real NIXL: {e}")),
    };
    if let Some(failed) = loopback
        .verdicts
        .iter()
        .find(|v| v.0.contains("holds one source"))
    {
        if failed.1.is_err() {
            return Verdict::Failed(format!("loopback: {} failed", failed.0));
        }
    }
    match difference(&loopback, &real) {
        None => Verdict::Passed,
        Some(diff) => Verdict::Failed(diff),
    }
}

fn main() -> ExitCode {
    let cases = [
        case!(write_permuted),
        case!(read_permuted),
        case!(several_agents),
        case!(duplicate_destinations),
        case!(prepare_rejections),
        case!(make_rejections),
        case!(metadata_rejections),
    ];
    let mut named: Vec<harness::NamedCase<'_>> = Vec::new();
    for case in &cases {
        for (label, options) in SETTINGS {
            named.push((
                format!("{}{label}", case.name),
                Box::new(move || run_case(case, options)),
            ));
        }
    }
    harness::run(named)
}
