//! A run printed as a timeline: each step's operation, what it allocated,
//! wrote, posted, landed and freed (which bytes moved when), what the
//! connector reported, and which oracle fired where.

use std::fmt::Write as _;

use super::operation::RequestId;
use super::oracles::Ledger;
use super::pools::BlockRef;
use super::record::{Event, Span};
use super::runner::ScenarioRun;

fn span(s: &Span) -> String {
    format!("{}[{}..{}]", s.engine.as_str(), s.offset, s.offset + s.len)
}

fn event_line(e: &Event) -> String {
    match e {
        Event::Submitted {
            request,
            prompt,
            prefix_hit_blocks,
        } => format!(
            "r{request} submitted: {prompt} tokens, prefix hit {prefix_hit_blocks} block(s)"
        ),
        Event::Allocated {
            block,
            request,
            position,
        } => format!("{block} -> r{request} (#{position})"),
        Event::Freed { block, request } => format!("{block} freed by r{request}"),
        Event::Wrote {
            span: s,
            request,
            cause,
        } => format!("write {} for r{request} ({cause:?})", span(s)),
        Event::Posted { request, pairs, .. } => {
            format!("r{request} posts a READ of {} pair(s)", pairs.len())
        }
        Event::Landed { pair } => format!(
            "pair of r{} lands: {} -> {}",
            pair.request,
            span(&pair.src),
            span(&pair.dst)
        ),
        Event::Received { request } => format!("r{request} received"),
        Event::Admitted { request, block } => {
            format!("{block} of r{request} enters the prefix cache")
        }
        Event::FirstStep { request } => format!("r{request} first decode step"),
        Event::PrefillFailed { request } => format!("prefill fails r{request}"),
        Event::LeaseReaped { request } => format!("prefill reaps r{request}'s expired lease"),
        Event::Ended { request, end } => format!("r{request} ends: {end:?}"),
        Event::Ignored { reason } => format!("ignored: {reason}"),
    }
}

/// Who owns which block after each step of `run` (the blocks owned, in
/// order; a block not listed is free).
pub fn owners_after_each_step(run: &ScenarioRun) -> Vec<Vec<(BlockRef, RequestId)>> {
    let mut ledger = Ledger::default();
    run.steps
        .iter()
        .map(|step| {
            for e in &step.events {
                ledger.apply(e);
            }
            ledger.owned()
        })
        .collect()
}

fn owners_line(owners: &[(BlockRef, RequestId)]) -> String {
    if owners.is_empty() {
        return "every block free".into();
    }
    owners
        .iter()
        .map(|(b, r)| format!("{b}=r{r}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The timeline of `run`: each step, its events, the ownership after it
/// when the step changed it, and the findings at it.
pub fn render(run: &ScenarioRun) -> String {
    let mut out = String::new();
    let owners = owners_after_each_step(run);
    for (i, step) in run.steps.iter().enumerate() {
        let drain = if step.drain { " (drain)" } else { "" };
        let _ = writeln!(out, "{i:>4} t={} {}{drain}", step.now, step.operation);
        for e in &step.events {
            let _ = writeln!(out, "       {}", event_line(e));
        }
        let changed = step
            .events
            .iter()
            .any(|e| matches!(e, Event::Allocated { .. } | Event::Freed { .. }));
        if changed {
            let _ = writeln!(out, "       owners: {}", owners_line(&owners[i]));
        }
        for f in run.findings.iter().filter(|f| f.step == i) {
            let _ = writeln!(out, "   !! {}: {}", f.oracle, f.message);
        }
    }
    out
}
