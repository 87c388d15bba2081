//! One sweep's cases as the driver's batch (`kvgeom-sglang-batch/1`,
//! sglang-driver/README.md): per case the request's pages on each engine
//! (seeded, distinct page ids in `1..=num_pages` with neighbours around
//! them), the model as SGLang's pools take it, and each rank's initial
//! memory as `<agent>.r<i>.in` files.

use std::path::Path;

use serde_json::json;

use super::error::ModelError;
use super::images::{decode_region, prefill_region, Placement};
use super::layout::{default_num_pages, EnginePools, PoolKind};
use super::state::{prefill_image, StatePools, STATE_SLOTS};
use crate::layout::Side;
use crate::scenario::Case;

/// The batch format the driver reads.
pub const BATCH_FORMAT: &str = "kvgeom-sglang-batch/1";

/// A case ready for the driver.
#[derive(Clone, Debug)]
pub struct Prepared {
    /// Its folder under the batch (and its id).
    pub id: String,
    /// Prefill's pools.
    pub prefill: EnginePools,
    /// Decode's pools.
    pub decode: EnginePools,
    /// The request's pages.
    pub placement: Placement,
    /// A hybrid model's state pools: (prefill, decode).
    pub state: Option<(StatePools, StatePools)>,
}

/// The request's state slot on prefill and on decode (distinct, so a write
/// from or into the wrong slot shows).
pub const STATE_SLOTS_OF_REQUEST: (u32, u32) = (2, 1);

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// `count` distinct page ids of `1..=num_pages`, drawn from `seed`.
pub fn draw_pages(num_pages: u32, count: u32, seed: u64) -> Vec<u32> {
    let mut ids: Vec<u32> = (1..=num_pages).collect();
    let mut state = seed;
    let n = ids.len();
    for i in 0..(count as usize).min(n) {
        state = mix(state);
        let j = i + (state % (n - i) as u64) as usize;
        ids.swap(i, j);
    }
    ids.truncate(count as usize);
    ids
}

fn name_hash(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// The pools and placement of `case`; `Err` names what the model cannot hold.
pub fn prepare(case: &Case, index: usize) -> Result<Prepared, ModelError> {
    let g = &case.geometry;
    let pages = |page_size: u32| case.prompt_len.div_ceil(page_size.max(1));
    let n = pages(g.prefill.logical_block).max(pages(g.decode.logical_block));
    let prefill = EnginePools::of(g, Side::Prefill, default_num_pages(n))?;
    let decode = EnginePools::of(g, Side::Decode, default_num_pages(n))?;
    for pools in [&prefill, &decode] {
        if pools.num_pages < n {
            return Err(ModelError::TooFewPages {
                side: pools.side,
                num_pages: pools.num_pages,
                needed: n,
            });
        }
    }
    let seed = mix(case.seed ^ name_hash(&g.name) ^ u64::from(case.prompt_len) << 32);
    let id: String = format!("{index:04}-{}-n{}", g.name, case.prompt_len)
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    Ok(Prepared {
        id,
        placement: Placement {
            prefill_pages: draw_pages(prefill.num_pages, n, seed),
            decode_pages: draw_pages(decode.num_pages, n, mix(seed ^ 0xd)),
            prompt_len: case.prompt_len,
        },
        state: g.sglang.as_ref().and_then(|s| s.state.as_ref()).map(|st| {
            (
                StatePools::new(Side::Prefill, st, prefill.attn_tp, STATE_SLOTS_OF_REQUEST.0),
                StatePools::new(Side::Decode, st, decode.attn_tp, STATE_SLOTS_OF_REQUEST.1),
            )
        }),
        prefill,
        decode,
    })
}

fn dtype(bytes: u32) -> Result<&'static str, ModelError> {
    match bytes {
        1 => Ok("uint8"),
        2 => Ok("bfloat16"),
        4 => Ok("float32"),
        bytes => Err(ModelError::Dtype { bytes }),
    }
}

/// The case's entry of `batch.json`.
pub fn case_spec(p: &Prepared) -> Result<serde_json::Value, ModelError> {
    let d = dtype(p.prefill.dtype_bytes)?;
    let model = match p.prefill.kind {
        PoolKind::Mha {
            total_heads,
            k_head_size,
            v_head_size,
        } => {
            let mut m = json!({"attention": "mha", "layers": p.prefill.layers,
                "total_kv_heads": total_heads, "head_dim": k_head_size, "dtype": d});
            if v_head_size != k_head_size {
                m["v_head_dim"] = json!(v_head_size);
            }
            m
        }
        PoolKind::Mla { latent } => {
            let rope = latent / 4;
            json!({"attention": "mla", "layers": p.prefill.layers,
                "kv_lora_rank": latent - rope, "qk_rope_head_dim": rope, "dtype": d})
        }
    };
    let engine = |e: &EnginePools, pages: &[u32]| {
        json!({"tp_size": e.attn_tp, "num_pages": e.num_pages, "page_size": e.page_size,
            "request_pages": pages})
    };
    let mut model = model;
    let (mut prefill, mut decode) = (
        engine(&p.prefill, &p.placement.prefill_pages),
        engine(&p.decode, &p.placement.decode_pages),
    );
    if let Some((ps, ds)) = &p.state {
        let mut st = ps.state.to_json();
        st["conv_dtype"] = json!("bfloat16");
        st["temporal_dtype"] = json!("float32");
        model["state"] = st;
        // The driver's model.layers counts every layer, linear ones too.
        model["layers"] = json!(p.prefill.layers + ps.state.layers.len() as u32);
        prefill["state_slot"] = json!(ps.slot);
        prefill["state_slots"] = json!(STATE_SLOTS);
        decode["state_slot"] = json!(ds.slot);
        decode["state_slots"] = json!(STATE_SLOTS);
    }
    Ok(json!({
        "id": p.id,
        "model": model,
        "page_size": p.prefill.page_size,
        "prompt_len": p.placement.prompt_len,
        "prefill": prefill,
        "decode": decode,
    }))
}

/// Prefill's initial images, `[rank][region]`.
pub fn prefill_images(p: &Prepared) -> Vec<Vec<Vec<u8>>> {
    (0..p.prefill.attn_tp)
        .map(|rank| {
            (0..p.prefill.regions(rank).len() as u32)
                .map(|i| prefill_region(&p.prefill, rank, i, &p.placement.prefill_pages))
                .collect()
        })
        .collect()
}

/// Prefill's initial state images, `[rank][tensor]`.
pub fn prefill_state_images(ps: &StatePools) -> Vec<Vec<Vec<u8>>> {
    (0..ps.attn_tp)
        .map(|rank| ps.tensors(rank).iter().map(prefill_image).collect())
        .collect()
}

/// Write the case's folder under `dir`: every rank's `.in` files.
pub fn write_case(dir: &Path, p: &Prepared) -> std::io::Result<()> {
    let case_dir = dir.join(&p.id);
    std::fs::create_dir_all(&case_dir)?;
    for (rank, regions) in prefill_images(p).iter().enumerate() {
        for (i, bytes) in regions.iter().enumerate() {
            std::fs::write(case_dir.join(format!("prefill-{rank}.r{i}.in")), bytes)?;
        }
    }
    if let Some((ps, ds)) = &p.state {
        for (rank, tensors) in prefill_state_images(ps).iter().enumerate() {
            for (i, bytes) in tensors.iter().enumerate() {
                std::fs::write(case_dir.join(format!("prefill-{rank}.s{i}.in")), bytes)?;
            }
        }
        for rank in 0..ds.attn_tp {
            for t in ds.tensors(rank) {
                std::fs::write(
                    case_dir.join(format!("decode-{rank}.s{}.in", t.index)),
                    decode_region(t.len()),
                )?;
            }
        }
    }
    for rank in 0..p.decode.attn_tp {
        for r in p.decode.regions(rank) {
            std::fs::write(
                case_dir.join(format!("decode-{rank}.r{}.in", r.index)),
                decode_region(r.len),
            )?;
        }
    }
    Ok(())
}

/// Write `batch.json` of `specs`, run over `nixl`.
pub fn write_batch(
    dir: &Path,
    specs: Vec<serde_json::Value>,
    case_timeout_s: u64,
    nixl: &crate::driver::NixlRun,
) -> std::io::Result<()> {
    let batch = json!({"format": BATCH_FORMAT, "case_timeout_s": case_timeout_s,
        "nixl": nixl.as_str(), "cases": specs});
    std::fs::write(dir.join("batch.json"), serde_json::to_vec_pretty(&batch)?)
}

#[cfg(test)]
mod tests {
    use super::draw_pages;

    #[test]
    fn drawn_pages_are_distinct_and_never_the_padding_page() {
        for seed in 0..50 {
            let p = draw_pages(10, 4, seed);
            assert_eq!(p.len(), 4);
            assert!(p.iter().all(|&x| (1..=10).contains(&x)));
            let mut s = p.clone();
            s.sort();
            s.dedup();
            assert_eq!(s.len(), 4);
        }
        assert_ne!(draw_pages(10, 4, 1), draw_pages(10, 4, 2));
    }
}
