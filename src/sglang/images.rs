//! The memory kvgeom prepares for an SGLang case and what each decode byte
//! must hold afterwards. Every byte of the request's prefill pages encodes
//! its TP-independent identity (layer, K/V/latent, request-relative token,
//! global KV head, byte) through [`crate::pattern`]'s attention pattern, so
//! ranks that replicate a head hold identical bytes for it; prefill's other
//! pages (and page 0) carry the "foreign" pattern of their rank; decode
//! starts as [`SENTINEL`].

use super::layout::{locate_in, Cell, EnginePools};
use crate::layout::Side;
use crate::pattern::{attention_cell_pattern, foreign_byte, SENTINEL};

/// Where the request's pages lie on both engines and how long the prompt is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Prefill's page ids of the request, in order.
    pub prefill_pages: Vec<u32>,
    /// Decode's page ids, in order.
    pub decode_pages: Vec<u32>,
    /// Tokens transferred.
    pub prompt_len: u32,
}

/// The provenance byte of a request token's cell.
pub fn request_byte(cell: &Cell, token: u32) -> u8 {
    let mut b = [0u8; 1];
    attention_cell_pattern(
        cell.layer,
        cell.part.code(),
        token,
        cell.head,
        cell.byte,
        &mut b,
    );
    b[0]
}

/// The request-relative token of `cell` on an engine whose request pages
/// are `pages`, when the cell lies in one of them.
pub fn request_token(cell: &Cell, pages: &[u32], page_size: u32) -> Option<u32> {
    let i = pages.iter().position(|&p| p == cell.page)? as u32;
    Some(i * page_size + cell.row)
}

/// Prefill's initial bytes of one region of `rank`: the request's pages
/// hold the coordinate pattern (every row of them), every other byte the
/// foreign pattern of this rank and region.
pub fn prefill_region(pools: &EnginePools, rank: u32, region: u32, pages: &[u32]) -> Vec<u8> {
    let regions = pools.regions(rank);
    let Some(r) = regions.get(region as usize) else {
        return Vec::new();
    };
    let mut out: Vec<u8> = (0..r.len)
        .map(|o| foreign_byte(Side::Prefill, rank, region, o))
        .collect();
    for (i, &page) in pages.iter().enumerate() {
        for row in 0..pools.page_size {
            let token = i as u32 * pools.page_size + row;
            let base =
                (u64::from(page) * u64::from(pools.page_size) + u64::from(row)) * r.row_bytes;
            for (h, &head) in r.heads.iter().enumerate() {
                let start = (base + h as u64 * r.head_bytes) as usize;
                let end = start + r.head_bytes as usize;
                if let Some(slot) = out.get_mut(start..end) {
                    attention_cell_pattern(r.layer, r.part.code(), token, head, 0, slot);
                }
            }
        }
    }
    out
}

/// Decode's initial bytes of a region of `len` bytes.
pub fn decode_region(len: u64) -> Vec<u8> {
    vec![SENTINEL; len as usize]
}

/// What a decode byte must hold after the transfer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// A transferred token's byte: prefill's.
    Exact(u8),
    /// A row of the request's last page at or past the prompt: prefill's
    /// byte for that slot, or untouched (SGLang copies whole pages).
    ExactOrSentinel(u8),
    /// Outside the request: untouched.
    Sentinel,
}

/// The expectation of byte `offset` of a decode rank's region `region`.
pub fn expected_decode(
    decode: &EnginePools,
    placement: &Placement,
    region: &super::layout::RegionModel,
    offset: u64,
) -> Option<(Cell, Expect)> {
    let cell = locate_in(region, decode.page_size, offset)?;
    let expect = match request_token(&cell, &placement.decode_pages, decode.page_size) {
        Some(t) if t < placement.prompt_len => Expect::Exact(request_byte(&cell, t)),
        Some(t) => Expect::ExactOrSentinel(request_byte(&cell, t)),
        None => Expect::Sentinel,
    };
    Some((cell, expect))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sglang::layout::{Part, PoolKind};

    #[test]
    fn replicas_hold_identical_request_bytes_and_never_the_sentinel() {
        let pools = EnginePools {
            side: Side::Prefill,
            kind: PoolKind::Mha {
                total_heads: 2,
                k_head_size: 8,
                v_head_size: 8,
            },
            layers: 1,
            dtype_bytes: 2,
            attn_tp: 4,
            page_size: 4,
            num_pages: 5,
        };
        let pages = [3, 1];
        let a = prefill_region(&pools, 0, 1, &pages);
        let b = prefill_region(&pools, 1, 1, &pages);
        let c = prefill_region(&pools, 2, 1, &pages);
        let row = pools.regions(0)[1].row_bytes as usize;
        let req = |img: &[u8]| img[3 * 4 * row..4 * 4 * row].to_vec();
        assert_eq!(req(&a), req(&b), "ranks 0 and 1 replicate head 0");
        assert_ne!(req(&a), req(&c), "rank 2 holds head 1");
        assert!(req(&a).iter().all(|&x| x != SENTINEL && x != 0));
        let cell = pools.locate(0, 1, (3 * 4 * row) as u64).expect("inside");
        assert_eq!((cell.part, cell.page, cell.head), (Part::V, 3, 0));
        assert_eq!(request_byte(&cell, 0), a[3 * 4 * row]);
    }
}
