//! `kvgeom explain`: one case in full: the derived geometry, the request's
//! blocks, every transfer pair, the post-process, and per decode block how
//! many bytes were transferred, zeroed or left stale; plus an SVG byte map.

use std::fmt::Write;

use crate::geometry::Geometry;
use crate::layout::Side;
use crate::pattern::{expected_decode_byte, SENTINEL};
use crate::scenario::CaseRun;

/// Byte classes of a decode request block after the post-process.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockBytes {
    /// Equal to what prefill held for that coordinate.
    pub transferred: u64,
    pub zeroed: u64,
    /// Still the sentinel: neither written nor zeroed.
    pub stale: u64,
    /// Anything else: the wrong token or region landed here.
    pub wrong: u64,
}

/// One decode request block of one region.
#[derive(Clone, Debug)]
pub struct BlockAccount {
    pub rank: u32,
    pub region: u32,
    pub group: usize,
    pub block: u32,
    pub bytes: BlockBytes,
    /// Class of every byte (0 transferred, 1 zeroed, 2 stale, 3 wrong);
    /// empty from [`account`], which keeps the counts only.
    pub classes: Vec<u8>,
}

/// Account every attention transfer block of every decode rank and region
/// (the counts: no class per byte).
pub fn account(run: &CaseRun) -> Vec<BlockAccount> {
    account_bytes(run, false)
}

/// [`account`], with the class of every byte kept (as many bytes as the
/// blocks hold: what the SVG map draws).
pub fn account_with_classes(run: &CaseRun) -> Vec<BlockAccount> {
    account_bytes(run, true)
}

fn account_bytes(run: &CaseRun, keep_classes: bool) -> Vec<BlockAccount> {
    let (Some(layout), Some(input)) = (&run.layout, &run.oracle_input) else {
        return Vec::new();
    };
    let geometry = layout.geometry();
    let mut out = Vec::new();
    for engine in layout.engines(Side::Decode) {
        let rank = engine.tp_rank();
        let Some(images) = input.memory(Side::Decode, rank) else {
            continue;
        };
        let page = engine.unified_page();
        for (group, blocks) in layout.blocks().decode_transfer.iter().enumerate() {
            if geometry.model.groups[group] != crate::geometry::GroupKind::Attention {
                continue;
            }
            for &block in blocks {
                for region in 0..engine.num_regions() {
                    let mut bytes = BlockBytes::default();
                    let mut classes =
                        Vec::with_capacity(if keep_classes { page as usize } else { 0 });
                    let after = &images.after[region as usize];
                    for off in u64::from(block) * page..u64::from(block + 1) * page {
                        let found = after[off as usize];
                        let class = match expected_decode_byte(layout, rank, region, off) {
                            Some(e) if e == found => 0,
                            None => continue,
                            _ if found == 0 => 1,
                            _ if found == SENTINEL => 2,
                            _ => 3,
                        };
                        match class {
                            0 => bytes.transferred += 1,
                            1 => bytes.zeroed += 1,
                            2 => bytes.stale += 1,
                            _ => bytes.wrong += 1,
                        }
                        if keep_classes {
                            classes.push(class);
                        }
                    }
                    out.push(BlockAccount {
                        rank,
                        region,
                        group,
                        block,
                        bytes,
                        classes,
                    });
                }
            }
        }
    }
    out
}

fn describe_geometry(g: &Geometry) -> String {
    let r = g.ratios();
    let mut out = String::new();
    let _ = writeln!(out, "geometry {}: {}", g.name, g.description);
    for (name, e) in [("prefill", &g.prefill), ("decode", &g.decode)] {
        let _ = writeln!(
            out,
            "  {name:<7}  TP {}  kernel {}  logical {}  ppl {}  kernel page {} B  logical page {} B  layout {}{}",
            e.tp_size,
            e.kernel_block,
            e.logical_block,
            e.ppl(),
            e.kernel_page_bytes(&g.model),
            e.unified_page_bytes(&g.model),
            e.layout.vllm_name(),
            if e.host_buffer { "  host buffer" } else { "" }
        );
    }
    let opt = |v: Option<u32>| v.map_or("not integral".to_string(), |x| x.to_string());
    let _ = writeln!(
        out,
        "  pull: block_size_ratio {}  tp_ratio {}   push: block_size_ratio {}  tp_ratio {}",
        opt(r.pull_block_size_ratio),
        r.pull_tp_ratio
            .map_or("not integral".into(), |t| t.to_string()),
        opt(r.push_block_size_ratio),
        r.push_tp_ratio
            .map_or("not integral".into(), |t| t.to_string()),
    );
    out
}

/// The full text explanation of one case.
pub fn explain_text(run: &CaseRun) -> String {
    let case = &run.report.case;
    let mut out = describe_geometry(&case.geometry);
    let _ = writeln!(
        out,
        "\ncase: N={} prefix hit {} mode {} allocation {} seed {}{}",
        case.prompt_len,
        case.prefix_hit,
        case.mode,
        case.allocation.as_str(),
        case.seed,
        case.variant
            .defect()
            .map_or(String::new(), |d| format!(" defect {d}"))
    );
    if let (Some(shape), Some(p)) = (&run.shape, &run.placement) {
        let _ = writeln!(out, "  transferred tokens M = {}", shape.transferred_tokens);
        let _ = writeln!(
            out,
            "  decode blocks per group {:?} (transfer writes {:?}), pool {}",
            p.decode, shape.decode_transfer_blocks, p.decode_pool
        );
        let _ = writeln!(
            out,
            "  prefill blocks per group {:?}, pool {}",
            p.prefill, p.prefill_pool
        );
    }
    let _ = writeln!(out, "\noutcome: {}", run.report.outcome.describe());
    if let Some(line) = run.report.stats.redundant_writes.explain_line() {
        let _ = writeln!(out, "{line}");
    }
    for (side, rank, transfers) in &run.transfers {
        for t in transfers {
            let _ = writeln!(
                out,
                "\n{side}-{rank} -> remote rank {}: {} pairs, notification \"{}\"",
                t.remote_rank,
                t.local_desc_ids.len(),
                t.notification
            );
            let _ = writeln!(
                out,
                "  local blocks {:?}\n  remote blocks {:?}",
                t.local_block_ids, t.remote_block_ids
            );
        }
    }
    if let Some(input) = &run.oracle_input {
        let _ = writeln!(out, "\npairs (destination <- source):");
        for p in &input.pairs {
            let _ = writeln!(
                out,
                "  {}: {} <- {}",
                p.id, p.destination.location, p.source.location
            );
        }
    }
    for (rank, plans) in &run.post_process {
        for plan in plans {
            let _ = writeln!(
                out,
                "\npost-process decode-{rank} group {}: blocks {:?}, covered {} sub-blocks at ratio {}, ops {:?}",
                plan.group, plan.block_ids, plan.covered_sub_blocks, plan.ratio, plan.ops
            );
        }
    }
    let accounts = account(run);
    if !accounts.is_empty() {
        let _ = writeln!(out, "\ndecode request blocks after the post-process:");
        let _ = writeln!(
            out,
            "  {:>4} {:>6} {:>5} {:>6} {:>11} {:>8} {:>8} {:>8}",
            "rank", "region", "group", "block", "transferred", "zeroed", "stale", "wrong"
        );
        for a in &accounts {
            let _ = writeln!(
                out,
                "  {:>4} {:>6} {:>5} {:>6} {:>11} {:>8} {:>8} {:>8}{}",
                a.rank,
                a.region,
                a.group,
                a.block,
                a.bytes.transferred,
                a.bytes.zeroed,
                a.bytes.stale,
                a.bytes.wrong,
                if a.bytes.stale + a.bytes.wrong > 0 {
                    "  <- stale/wrong bytes"
                } else {
                    ""
                }
            );
        }
    }
    if !run.report.violations.is_empty() {
        let _ = writeln!(out, "\nviolations ({}):", run.report.violations.len());
        for v in run.report.violations.iter().take(50) {
            let _ = writeln!(out, "  {v}");
        }
    }
    let _ = writeln!(out, "\nreplay: {}", case.replay_command());
    out
}

/// An SVG byte map: one row per decode request block and region, each byte
/// (downsampled to at most 512 cells) coloured by its class.
pub fn svg(run: &CaseRun) -> String {
    let accounts = account_with_classes(run);
    const CELLS: usize = 512;
    const COLOURS: [&str; 4] = ["#3c9d4e", "#b0b0b0", "#d62728", "#ff9f1c"];
    let row_h = 14;
    let width = CELLS + 220;
    let height = (accounts.len() + 3) * row_h + 10;
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" font-family=\"monospace\" font-size=\"10\">\n"
    );
    let _ = writeln!(
        out,
        "<text x=\"4\" y=\"12\">{} N={} {}: green transferred, grey zeroed, red stale, orange wrong</text>",
        run.report.case.geometry_name(),
        run.report.case.prompt_len,
        run.report.case.mode
    );
    for (i, a) in accounts.iter().enumerate() {
        let y = (i + 1) * row_h + 6;
        let _ = writeln!(
            out,
            "<text x=\"4\" y=\"{}\">d{} r{} g{} b{}</text>",
            y + 10,
            a.rank,
            a.region,
            a.group,
            a.block
        );
        let per_cell = a.classes.len().div_ceil(CELLS).max(1);
        for (c, chunk) in a.classes.chunks(per_cell).enumerate() {
            // The worst class in the chunk wins, so one stale byte shows.
            let class = chunk.iter().copied().max().unwrap_or(0) as usize;
            let _ = writeln!(
                out,
                "<rect x=\"{}\" y=\"{y}\" width=\"1\" height=\"{}\" fill=\"{}\"/>",
                200 + c,
                row_h - 2,
                COLOURS[class]
            );
        }
    }
    out.push_str("</svg>\n");
    out
}
