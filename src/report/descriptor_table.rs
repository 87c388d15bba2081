//! Descriptor lists rendered as readable tables: one row per strided run
//! with its region, kind, offset from the region base, length, stride and
//! count. Used by the layout snapshots and by `kvgeom explain`.

use std::fmt::Write;

use crate::nixl::DescList;

/// What a list's rows describe, to label each run.
#[derive(Clone, Debug)]
pub struct ListLabels {
    /// Region bases of the memory the list addresses (region order).
    pub region_bases: Vec<u64>,
    /// Rows before this id are attention pages; the rest are mamba sub-regions.
    pub attention_rows: u64,
    /// Sub-regions per mamba region: conv projections then the SSM state.
    pub state_parts: usize,
}

fn region_of(bases: &[u64], addr: u64) -> Option<(usize, u64)> {
    bases
        .iter()
        .enumerate()
        .filter(|(_, &b)| b <= addr)
        .max_by_key(|(_, &b)| b)
        .map(|(i, &b)| (i, addr - b))
}

/// Render `list` as a table titled `title`.
pub fn render(title: &str, list: &DescList, labels: &ListLabels) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{title} ({} descriptors, {} runs)",
        list.len(),
        list.runs().len()
    );
    let _ = writeln!(
        out,
        "  {:>5}  {:>6}  {:<9}  {:>10}  {:>8}  {:>8}  {:>6}",
        "ids", "region", "kind", "offset", "len", "stride", "count"
    );
    let mut first_id = 0u64;
    let mut state_run = 0usize;
    for run in list.runs() {
        let kind = if first_id < labels.attention_rows {
            "attention".to_string()
        } else {
            let part = state_run % labels.state_parts.max(1);
            state_run += 1;
            if part + 1 == labels.state_parts {
                "ssm".to_string()
            } else {
                format!("conv{part}")
            }
        };
        let (region, offset) = match region_of(&labels.region_bases, run.addr) {
            Some((r, o)) => (r.to_string(), o.to_string()),
            None => ("?".to_string(), format!("{:#x}", run.addr)),
        };
        let _ = writeln!(
            out,
            "  {:>5}  {:>6}  {:<9}  {:>10}  {:>8}  {:>8}  {:>6}",
            first_id, region, kind, offset, run.len, run.stride, run.count
        );
        first_id += run.count;
    }
    out
}
