//! The counts of a v1 trace must agree with each other before a verdict is
//! given: the prompt and transferred tokens with the blocks that hold them,
//! the prefix hit with the test's parameters, each size the trace states
//! twice (the test's parameters and arguments, the worker's derived
//! geometry, the remote metadata) with its other statement. A trace whose
//! counts disagree is an error of that file naming the field; it is never
//! judged on one of its two readings.

use serde_json::Value;

use super::case::TraceCase;
use super::error::{Disagreement, TraceErrorKind};
use crate::limits::MAX_PROMPT_LEN;

fn inconsistent(
    ev: &'static str,
    field: impl Into<String>,
    value: impl std::fmt::Display,
    expected: impl Into<String>,
) -> TraceErrorKind {
    TraceErrorKind::Inconsistent(Box::new(Disagreement {
        ev,
        field: field.into(),
        value: value.to_string(),
        expected: expected.into(),
    }))
}

/// `value` of `ev`'s `field` must be `expected`, which `source` states.
fn agree(
    ev: &'static str,
    field: &str,
    value: u64,
    expected: u64,
    source: &str,
) -> Result<(), TraceErrorKind> {
    if value == expected {
        return Ok(());
    }
    Err(inconsistent(
        ev,
        field,
        value,
        format!("{source} is {expected}"),
    ))
}

/// The sizes the whole trace needs, each from its one modelled source.
struct Sizes {
    decode_block: u64,
    prefill_block: u64,
    prompt_len: Option<u64>,
    transferred: Option<u64>,
    hit_blocks: u64,
}

/// Every count of `case` agrees with the others.
pub fn check_counts(case: &TraceCase) -> Result<(), TraceErrorKind> {
    worker(case)?;
    remotes(case)?;
    let sizes = request(case)?;
    params(case, &sizes)?;
    case_args(case, &sizes)?;
    remote_args(case)?;
    for x in &case.xfers {
        if x.local_ids.len() != x.remote_ids.len() {
            return Err(inconsistent(
                "xfer",
                "local_ids",
                format!("{} ids", x.local_ids.len()),
                format!("remote_ids has {} (one per pair)", x.remote_ids.len()),
            ));
        }
    }
    Ok(())
}

fn worker(case: &TraceCase) -> Result<(), TraceErrorKind> {
    const EV: &str = "local_geometry";
    let w = &case.worker;
    let g = &case.local_geometry;
    if w.tp_rank >= w.tp_size {
        return Err(inconsistent(
            "make_worker",
            "args.tp_rank",
            w.tp_rank,
            format!("args.tp_size is {}", w.tp_size),
        ));
    }
    if w.local_block_size % w.kernel_block_size != 0 {
        return Err(inconsistent(
            "make_worker",
            "args.local_block_size",
            w.local_block_size,
            format!(
                "it must be a multiple of args.kernel_block_size ({})",
                w.kernel_block_size
            ),
        ));
    }
    let ppl = w.local_block_size / w.kernel_block_size;
    let mw = |f: &str| format!("make_worker args.{f}");
    agree(
        EV,
        "geometry.tp_rank",
        g.tp_rank.into(),
        w.tp_rank.into(),
        &mw("tp_rank"),
    )?;
    agree(
        EV,
        "geometry.world_size",
        g.world_size.into(),
        w.tp_size.into(),
        &mw("tp_size"),
    )?;
    agree(
        EV,
        "geometry.block_size",
        g.block_size.into(),
        w.kernel_block_size.into(),
        &mw("kernel_block_size"),
    )?;
    agree(
        EV,
        "geometry._logical_num_blocks",
        g.logical_num_blocks,
        w.num_logical_blocks.into(),
        &mw("num_logical_blocks"),
    )?;
    agree(
        EV,
        "geometry._physical_blocks_per_logical_kv_block",
        g.physical_blocks_per_logical.into(),
        ppl.into(),
        "make_worker args.local_block_size / kernel_block_size",
    )?;
    agree(
        EV,
        "geometry.num_blocks",
        g.num_blocks,
        u64::from(w.num_logical_blocks) * u64::from(ppl),
        "make_worker num_logical_blocks x blocks per logical block",
    )?;
    let regions = case.local_regions.len() as u64;
    agree(
        EV,
        "geometry.num_regions",
        g.num_regions.into(),
        regions,
        "the regions register_memory registered",
    )?;
    for (field, len) in [
        ("geometry.block_len_per_layer", g.block_len_per_layer.len()),
        (
            "geometry.block_stride_per_layer",
            g.block_stride_per_layer.len(),
        ),
        ("geometry.region_num_blocks", g.region_num_blocks.len()),
    ] {
        if len as u64 != regions {
            return Err(inconsistent(
                EV,
                field,
                format!("{len} entries"),
                format!("register_memory registered {regions} regions"),
            ));
        }
    }
    if g.has_mamba {
        match g.mamba_ssm_size.as_deref() {
            Some([_, _]) => {}
            other => {
                return Err(inconsistent(
                    EV,
                    "geometry._mamba_ssm_size",
                    serde_json::to_string(&other).unwrap_or_default(),
                    "_has_mamba is true, which needs the (conv, ssm) sizes",
                ))
            }
        }
    }
    Ok(())
}

fn remotes(case: &TraceCase) -> Result<(), TraceErrorKind> {
    const EV: &str = "add_remote_agent";
    let g = &case.local_geometry;
    let b = &case.request.blocks;
    for r in &case.remotes {
        if r.tp_rank >= r.tp_size {
            return Err(inconsistent(
                EV,
                "args.remote_tp_rank",
                r.tp_rank,
                format!("args.remote_tp_size is {}", r.tp_size),
            ));
        }
        agree(
            EV,
            "args.remote_tp_size",
            r.tp_size.into(),
            b.tp_size.into(),
            "request tp_size",
        )?;
        let m = &r.meta;
        for (field, len) in [
            (
                "remote_meta.kv_caches_base_addr",
                m.kv_caches_base_addr.len(),
            ),
            ("remote_meta.block_lens", m.block_lens.len()),
        ] {
            if len != case.local_regions.len() {
                return Err(inconsistent(
                    EV,
                    field,
                    format!("{len} entries"),
                    format!("decode registered {} regions", case.local_regions.len()),
                ));
            }
        }
        if let Some(first) = case.remotes.first().filter(|f| !std::ptr::eq(*f, r)) {
            let f = &first.meta;
            for (field, value, theirs) in [
                (
                    "remote_meta.block_size",
                    u64::from(m.block_size),
                    u64::from(f.block_size),
                ),
                (
                    "remote_meta.physical_blocks_per_logical_kv_block",
                    m.physical_blocks_per_logical_kv_block.into(),
                    f.physical_blocks_per_logical_kv_block.into(),
                ),
                ("remote_meta.num_blocks", m.num_blocks, f.num_blocks),
            ] {
                agree(EV, field, value, theirs, "the first remote rank's")?;
            }
        }
        if !g.has_mamba {
            continue;
        }
        let local = g.mamba_ssm_size.clone().unwrap_or_default();
        let Some(sizes) = &m.ssm_sizes else { continue };
        // Both sides shard the same model's state: one rank's shard times
        // its TP size is the model's.
        let model: Vec<u64> = local
            .iter()
            .map(|&s| s.saturating_mul(case.worker.tp_size.into()))
            .collect();
        let theirs: Vec<u64> = sizes
            .iter()
            .map(|&s| s.saturating_mul(r.tp_size.into()))
            .collect();
        if model != theirs {
            return Err(inconsistent(
                EV,
                "remote_meta.ssm_sizes",
                Value::from(sizes.clone()),
                format!(
                    "decode's shard {local:?} over decode TP {} is a model state of {model:?}, \
                     which prefill TP {} shards otherwise",
                    case.worker.tp_size, r.tp_size
                ),
            ));
        }
    }
    Ok(())
}

/// P's logical block in tokens, from the first remote rank (the kernel
/// block when there is none).
fn prefill_block(case: &TraceCase) -> u64 {
    case.remotes.first().map_or(0, |r| {
        u64::from(r.meta.block_size) * u64::from(r.meta.physical_blocks_per_logical_kv_block)
    })
}

fn request(case: &TraceCase) -> Result<Sizes, TraceErrorKind> {
    const EV: &str = "request";
    let r = &case.request;
    let b = &r.blocks;
    let groups = b.local_block_ids.len();
    for (field, len) in [
        ("local_physical_block_ids", b.local_physical_block_ids.len()),
        ("remote_block_ids", b.remote_block_ids.len()),
    ] {
        if len != groups {
            return Err(inconsistent(
                EV,
                field,
                format!("{len} groups"),
                format!("local_block_ids has {groups}"),
            ));
        }
    }
    if !b.local_num_computed_blocks.is_empty() && b.local_num_computed_blocks.len() != groups {
        return Err(inconsistent(
            EV,
            "local_num_computed_blocks",
            format!("{} groups", b.local_num_computed_blocks.len()),
            format!("local_block_ids has {groups}"),
        ));
    }
    let w = &case.worker;
    let ppl = u64::from(w.local_block_size / w.kernel_block_size.max(1));
    for (g, (logical, physical)) in b
        .local_block_ids
        .iter()
        .zip(&b.local_physical_block_ids)
        .enumerate()
    {
        let expanded: Vec<u64> = if g == 0 {
            logical
                .iter()
                .flat_map(|&id| (0..ppl).map(move |k| id * ppl + k))
                .collect()
        } else {
            logical.clone()
        };
        if *physical != expanded {
            return Err(inconsistent(
                EV,
                format!("local_physical_block_ids[{g}]"),
                Value::from(physical.clone()),
                format!("local_block_ids[{g}] gives {expanded:?}"),
            ));
        }
    }
    let decode_block = u64::from(w.local_block_size);
    let prefill_block = prefill_block(case);
    let hit_blocks = u64::from(case.prefix_hit_blocks());
    // The prefix hit and the request's blocks lie in decode's pool, and the
    // hit is no longer than the longest prompt.
    let request_blocks = b.local_block_ids.first().map_or(0, |g| g.len() as u64);
    let pool = u64::from(w.num_logical_blocks);
    if hit_blocks.saturating_add(request_blocks) > pool
        || hit_blocks.saturating_mul(decode_block) > u64::from(MAX_PROMPT_LEN)
    {
        return Err(inconsistent(
            EV,
            "local_num_computed_blocks[0]",
            hit_blocks,
            format!(
                "decode's pool holds {pool} logical blocks of {decode_block} tokens, {request_blocks} of \
                 them the request's, and a prompt at most {MAX_PROMPT_LEN} tokens"
            ),
        ));
    }
    let mut sizes = Sizes {
        decode_block,
        prefill_block,
        prompt_len: r.prompt_len.map(u64::from),
        transferred: None,
        hit_blocks,
    };
    let Some(n) = r.prompt_len else {
        if let Some(m) = r.matched_tokens {
            return Err(inconsistent(
                EV,
                "matched_tokens",
                m,
                "prompt_len is null (a test that sets block ids directly has neither)",
            ));
        }
        return Ok(sizes);
    };
    let n = u64::from(n);
    if n == 0 || n > u64::from(MAX_PROMPT_LEN) {
        return Err(inconsistent(
            EV,
            "prompt_len",
            n,
            format!("a prompt has 1 to {MAX_PROMPT_LEN} tokens"),
        ));
    }
    // The model's rule: decode recomputes the last token of a hybrid model.
    let rule = if case.local_geometry.has_mamba && n > 1 {
        n - 1
    } else {
        n
    };
    let m = match r.matched_tokens {
        Some(m) if u64::from(m) != rule => {
            return Err(inconsistent(
                EV,
                "matched_tokens",
                m,
                format!(
                    "prompt_len {n} transfers {rule} tokens ({})",
                    if case.local_geometry.has_mamba {
                        "N - 1: decode recomputes the last token of a hybrid model; a drafter's \
                         longer lookahead is not modelled"
                    } else {
                        "N: without mamba groups decode recomputes none; a drafter's lookahead \
                         is not modelled"
                    }
                ),
            ))
        }
        _ => rule,
    };
    sizes.transferred = Some(m);
    let hit_tokens = hit_blocks * decode_block;
    if hit_tokens > m {
        return Err(inconsistent(
            EV,
            "local_num_computed_blocks[0]",
            hit_blocks,
            format!(
                "{hit_blocks} blocks of {decode_block} tokens are more than the {m} tokens transferred"
            ),
        ));
    }
    let decode_blocks = hit_blocks + b.local_block_ids.first().map_or(0, |g| g.len() as u64);
    holds(
        EV,
        "local_block_ids[0]",
        decode_blocks,
        decode_block,
        "decode",
        n,
        m,
        hit_blocks,
    )?;
    let prefill_blocks = b.remote_block_ids.first().map_or(0, |g| g.len() as u64);
    if prefill_block > 0 {
        holds(
            EV,
            "remote_block_ids[0]",
            prefill_blocks,
            prefill_block,
            "prefill",
            n,
            m,
            0,
        )?;
    }
    if let Some(alloc) = case.meta.params.get("alloc").and_then(Value::as_str) {
        let (tokens, rule) = if alloc == "mainline" {
            (m, "the transferred tokens")
        } else {
            (n, "the whole prompt")
        };
        let expected = tokens.div_ceil(decode_block);
        if decode_blocks != expected {
            return Err(inconsistent(
                EV,
                "local_block_ids[0]",
                format!("{} blocks after {hit_blocks} prefix-hit blocks", decode_blocks - hit_blocks),
                format!(
                    "meta params.alloc {alloc:?} gives decode blocks for {rule}: {expected} blocks of {decode_block} tokens for {tokens} tokens"
                ),
            ));
        }
    }
    Ok(sizes)
}

/// `blocks` of `block` tokens hold the `m` transferred tokens, and none
/// lies wholly past the prompt's `n` tokens.
#[allow(clippy::too_many_arguments)]
fn holds(
    ev: &'static str,
    field: &str,
    blocks: u64,
    block: u64,
    side: &str,
    n: u64,
    m: u64,
    hit_blocks: u64,
) -> Result<(), TraceErrorKind> {
    let hit = if hit_blocks > 0 {
        format!(" (with {hit_blocks} prefix-hit blocks)")
    } else {
        String::new()
    };
    if blocks.saturating_mul(block) < m {
        return Err(inconsistent(
            ev,
            field,
            format!("{} blocks{hit}", blocks - hit_blocks),
            format!(
                "{side}'s {blocks} blocks of {block} tokens hold {} tokens, fewer than the {m} transferred of prompt_len {n}",
                blocks * block
            ),
        ));
    }
    if blocks > 0 && (blocks - 1).saturating_mul(block) >= n {
        return Err(inconsistent(
            ev,
            field,
            format!("{} blocks{hit}", blocks - hit_blocks),
            format!(
                "{side}'s {blocks} blocks of {block} tokens reach past the {n}-token prompt by a whole block"
            ),
        ));
    }
    Ok(())
}

/// A `meta.params` value that must be a non-negative integer.
fn param(case: &TraceCase, key: &str) -> Result<Option<u64>, TraceErrorKind> {
    match case.meta.params.get(key) {
        None => Ok(None),
        Some(v) => v.as_u64().map(Some).ok_or_else(|| {
            inconsistent(
                "meta",
                format!("params.{key}"),
                v,
                "it must be a non-negative integer",
            )
        }),
    }
}

fn params(case: &TraceCase, sizes: &Sizes) -> Result<(), TraceErrorKind> {
    const EV: &str = "meta";
    let w = &case.worker;
    let b = &case.request.blocks;
    let checks: [(&str, Option<u64>, &str); 8] = [
        ("num_tokens", sizes.prompt_len, "request prompt_len"),
        (
            "local_block",
            Some(sizes.decode_block),
            "make_worker args.local_block_size",
        ),
        (
            "remote_block",
            Some(sizes.prefill_block),
            "the remote rank's logical block (block_size x blocks per logical block)",
        ),
        (
            "kernel",
            Some(w.kernel_block_size.into()),
            "make_worker args.kernel_block_size",
        ),
        (
            "cached",
            Some(sizes.hit_blocks),
            "request local_num_computed_blocks[0]",
        ),
        ("d_rank", Some(w.tp_rank.into()), "make_worker args.tp_rank"),
        ("d_tp", Some(w.tp_size.into()), "make_worker args.tp_size"),
        ("p_tp", Some(b.tp_size.into()), "request tp_size"),
    ];
    for (key, expected, source) in checks {
        if let (Some(value), Some(expected)) = (param(case, key)?, expected) {
            agree(EV, &format!("params.{key}"), value, expected, source)?;
        }
    }
    // The hit in tokens: decode holds the whole blocks it covers.
    if let Some(tokens) = param(case, "prefix_hit")? {
        if tokens / sizes.decode_block.max(1) != sizes.hit_blocks {
            return Err(inconsistent(
                EV,
                "params.prefix_hit",
                tokens,
                format!(
                    "{tokens} tokens cover {} whole blocks of {} tokens, and request \
                     local_num_computed_blocks[0] is {}",
                    tokens / sizes.decode_block.max(1),
                    sizes.decode_block,
                    sizes.hit_blocks
                ),
            ));
        }
    }
    Ok(())
}

fn case_args(case: &TraceCase, sizes: &Sizes) -> Result<(), TraceErrorKind> {
    const EV: &str = "case";
    let Some(a) = &case.case_args else {
        return Ok(());
    };
    let w = &case.worker;
    agree(
        EV,
        "args.local_block",
        a.local_block.into(),
        w.local_block_size.into(),
        "make_worker args.local_block_size",
    )?;
    agree(
        EV,
        "args.kernel",
        a.kernel.into(),
        w.kernel_block_size.into(),
        "make_worker args.kernel_block_size",
    )?;
    if sizes.prefill_block > 0 {
        agree(
            EV,
            "args.remote_block",
            a.remote_block.into(),
            sizes.prefill_block,
            "the remote rank's logical block",
        )?;
    }
    if let Some(n) = sizes.prompt_len {
        agree(
            EV,
            "args.num_tokens",
            a.num_tokens.into(),
            n,
            "request prompt_len",
        )?;
    }
    agree(
        EV,
        "args.tp_size",
        a.tp_size.into(),
        case.request.blocks.tp_size.into(),
        "request tp_size (prefill's TP)",
    )?;
    // `remote_kernel` null: the same kernel block as decode's.
    if let Some(r) = case.remotes.first() {
        agree(
            EV,
            "args.remote_kernel",
            a.remote_kernel.unwrap_or(a.kernel).into(),
            r.meta.block_size.into(),
            "the remote rank's block_size",
        )?;
    }
    agree(
        EV,
        "args.cached",
        a.cached.into(),
        sizes.hit_blocks,
        "request local_num_computed_blocks[0]",
    )?;
    agree(
        EV,
        "args.local_rank",
        a.local_rank.into(),
        w.tp_rank.into(),
        "make_worker args.tp_rank",
    )
}

fn remote_args(case: &TraceCase) -> Result<(), TraceErrorKind> {
    const EV: &str = "make_remote_meta";
    let (Some(a), Some(r)) = (&case.remote_args, case.remotes.first()) else {
        return Ok(());
    };
    let m = &r.meta;
    let ppl = u64::from(m.physical_blocks_per_logical_kv_block);
    agree(
        EV,
        "args.remote_block_size",
        a.remote_block_size.into(),
        u64::from(m.block_size) * ppl,
        "the remote rank's logical block",
    )?;
    agree(
        EV,
        "args.remote_kernel_block_size",
        a.remote_kernel_block_size.into(),
        m.block_size.into(),
        "the remote rank's block_size",
    )?;
    agree(
        EV,
        "args.remote_num_logical",
        a.remote_num_logical.into(),
        m.num_blocks / ppl.max(1),
        "the remote rank's num_blocks / blocks per logical block",
    )
}
