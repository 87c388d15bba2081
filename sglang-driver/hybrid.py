"""Hybrid linear-attention models (Mamba2 / GDN / KDA) on SGLang's own pools.

A case whose model has a `state` part gets, per rank, SGLang's
`MambaPool` (built from SGLang's own state shape: `Mamba2StateShape.create`
for Mamba2 and GDN, `KimiLinearStateShape.create` for KDA) inside SGLang's
`HybridLinearKVPool` (its full-attention layers MHA/GQA or MLA). SGLang's
`setup_state_kv_args` then gives the state component (ptrs, item lengths,
dims per tensor, slice outer counts, conv sub-blocks, layer ids) and
`maybe_send_extra` sends the request's state slot with the last chunk: whole
(`_send_mamba_state`, or the prepared plan) when the attention TP sizes are
equal, sliced (`_send_mamba_state_slice`) when they differ.

The driver never computes a slice itself. It records what SGLang's
`compute_mamba_state_slice_byte_blocks` was called with and returned
(`state_slices` in result.json), and, for its own seeded fill, the model
channel each local state channel holds (`channel_ids`): that is the driver's
statement of how the model shards its state, independent of SGLang's
transfer code (kvgeom's layout model in `src/sglang/` is another).
"""

import numpy as np

KINDS = ("mamba2", "gdn", "kda")
SLICE_CALLS = []  # every call of compute_mamba_state_slice_byte_blocks this case
# Where this case's conv sub-blocks came from (SGLang's config code, the
# geometry file, or SGLang's state-shape defaults), as result.json reports it.
CONV_SOURCE = {}


class StateError(Exception):
    """The case's state part is not valid."""


def _need(st, *names):
    for n in names:
        if n not in st:
            raise StateError(f"model.state.{n} is missing (kind {st.get('kind')})")
        if not isinstance(st[n], int) or isinstance(st[n], bool) or st[n] <= 0:
            raise StateError(f"model.state.{n} must be a positive integer, got {st[n]!r}")


def validate(model):
    st = model["state"]
    if not isinstance(st, dict):
        raise StateError("model.state must be an object")
    kind = st.get("kind")
    if kind not in KINDS:
        raise StateError(f"model.state.kind must be one of {', '.join(KINDS)}, got {kind!r}")
    _need(st, "conv_kernel")
    if kind == "mamba2":
        _need(st, "n_groups", "ssm_state_size", "num_heads", "head_dim")
    elif kind == "gdn":
        _need(st, "num_k_heads", "head_k_dim", "num_v_heads", "head_v_dim")
    else:
        _need(st, "num_heads", "head_dim")
    layers = st.get("layers")
    if not isinstance(layers, list) or not layers or any(
            not isinstance(x, int) or x < 0 or x >= model["layers"] for x in layers) or len(set(layers)) != len(layers):
        raise StateError(f"model.state.layers must list distinct layer ids below model.layers ({model['layers']})")
    if len(layers) >= model["layers"]:
        raise StateError("model.state.layers leaves no full-attention layer")
    csg = st.get("conv_shard_groups", "default")
    if csg not in ("default", None) and (
            not isinstance(csg, list) or not csg or any(not isinstance(x, int) or x <= 0 for x in csg)):
        raise StateError("model.state.conv_shard_groups must be null, \"default\" or a list of positive integers")


def attention_layers(model):
    lin = set(model["state"]["layers"])
    return [i for i in range(model["layers"]) if i not in lin]


def conv_blocks(st):
    """The model's conv sub-blocks, full (unsharded) channel counts, in the
    order they sit in each rank's conv row: Mamba2 x | B | C, GDN q | k | v,
    KDA q | k | v. (The model's, not SGLang's conv_shard_groups.)"""
    if st["kind"] == "mamba2":
        x = st["num_heads"] * st["head_dim"]
        g = st["n_groups"] * st["ssm_state_size"]
        return [("x", x), ("B", g), ("C", g)]
    if st["kind"] == "gdn":
        k = st["num_k_heads"] * st["head_k_dim"]
        return [("q", k), ("k", k), ("v", st["num_v_heads"] * st["head_v_dim"])]
    k = st.get("num_k_heads", st["num_heads"]) * st.get("head_k_dim", st["head_dim"])
    return [("q", st["num_heads"] * st["head_dim"]), ("k", k), ("v", k)]


def gdn_shape_from_config(st, tp_size):
    """The GDN state shape as the installed release's own Qwen3-Next config
    (`configs/qwen3_next.py`, which Qwen3.5's text config inherits) makes it:
    its `mamba2_cache_params` decides whether the conv row carries the
    q | k | v sub-blocks (`conv_shard_groups`; absent before 0.5.16). The
    config reads the attention TP from the runtime context (0.5.16+) or from
    `dp_attention.get_attention_tp_size` (older); both answer `tp_size` for
    the call. Its CPU-backend branch (head padding for SGLang's CPU kernels)
    is skipped: the driver stands for a GPU engine."""
    import types

    from sglang.srt.configs import qwen3_next as q
    from sglang.srt.layers import dp_attention

    cfg = q.Qwen3NextConfig(linear_conv_kernel_dim=st["conv_kernel"], linear_key_head_dim=st["head_k_dim"],
                            linear_value_head_dim=st["head_v_dim"], linear_num_key_heads=st["num_k_heads"],
                            linear_num_value_heads=st["num_v_heads"], num_hidden_layers=2,
                            full_attention_interval=2)
    saved = {"_is_cpu": getattr(q, "_is_cpu", None), "get_parallel": getattr(q, "get_parallel", None),
             "tp": getattr(dp_attention, "get_attention_tp_size", None)}
    q._is_cpu = False
    if saved["get_parallel"] is not None:
        q.get_parallel = lambda: types.SimpleNamespace(attn_tp_size=tp_size)
    if saved["tp"] is not None:
        dp_attention.get_attention_tp_size = lambda: tp_size
    try:
        shape = cfg.mamba2_cache_params.shape
    finally:
        q._is_cpu = saved["_is_cpu"]
        if saved["get_parallel"] is not None:
            q.get_parallel = saved["get_parallel"]
        if saved["tp"] is not None:
            dp_attention.get_attention_tp_size = saved["tp"]
    CONV_SOURCE["source"] = "sglang.srt.configs.qwen3_next.Qwen3NextConfig.mamba2_cache_params"
    CONV_SOURCE["conv_shard_groups"] = getattr(shape, "conv_shard_groups", None)
    return shape


def cache_params(model, tp_size, torch):
    """SGLang's own cache params for one rank (published context in place)."""
    from sglang.srt.configs import mamba_utils as mu

    st = model["state"]
    dt = mu.Mamba2StateDType(conv=getattr(torch, st.get("conv_dtype", "bfloat16")),
                             temporal=getattr(torch, st.get("temporal_dtype", "float32")))
    csg = st.get("conv_shard_groups", "default")
    if st["kind"] == "mamba2":
        # What Nemotron-H / Falcon-H1 / Granite-4.0-H's configs pass: no
        # conv_shard_groups unless the case names some.
        CONV_SOURCE["source"] = ("Mamba2StateShape.create without conv_shard_groups (as the Mamba2 configs call it)"
                                 if csg == "default" else "geometry file (model.state.conv_shard_groups)")
        # (Releases before 0.5.16 have no conv_shard_groups argument.)
        named = {} if csg == "default" else {"conv_shard_groups": csg}
        shape = mu.Mamba2StateShape.create(
            tp_world_size=tp_size, intermediate_size=st["num_heads"] * st["head_dim"], n_groups=st["n_groups"],
            num_heads=st["num_heads"], head_dim=st["head_dim"], state_size=st["ssm_state_size"],
            conv_kernel=st["conv_kernel"], **named)
        return mu.Mamba2CacheParams(shape=shape, layers=list(st["layers"]), dtype=dt)
    if st["kind"] == "gdn" and csg == "default":
        shape = gdn_shape_from_config(st, tp_size)
        return mu.Mamba2CacheParams(shape=shape, layers=list(st["layers"]), dtype=dt)
    if st["kind"] == "gdn":
        # A known-defect variant: the case names the conv sub-blocks itself
        # (an error on a release whose state shape has no such argument).
        CONV_SOURCE["source"] = "geometry file (model.state.conv_shard_groups)"
        key_dim = st["head_k_dim"] * st["num_k_heads"]
        value_dim = st["head_v_dim"] * st["num_v_heads"]
        shape = mu.Mamba2StateShape.create(
            tp_world_size=tp_size, intermediate_size=value_dim, n_groups=st["num_k_heads"],
            num_heads=st["num_v_heads"], head_dim=st["head_v_dim"], state_size=st["head_k_dim"],
            conv_kernel=st["conv_kernel"], **({} if csg is None else {"conv_shard_groups": csg}))
        return mu.Mamba2CacheParams(shape=shape, layers=list(st["layers"]), dtype=dt)
    shape = mu.KimiLinearStateShape.create(
        tp_world_size=tp_size, num_heads=st["num_heads"], head_dim=st["head_dim"],
        num_k_heads=st.get("num_k_heads"), head_k_dim=st.get("head_k_dim"), conv_kernel_size=st["conv_kernel"])
    CONV_SOURCE["source"] = "sglang.srt.configs.mamba_utils.KimiLinearStateShape.create"
    if csg != "default":
        CONV_SOURCE["source"] = "geometry file (model.state.conv_shard_groups)"
        # A known-defect variant: KDA with other (or no) conv sub-blocks.
        import dataclasses
        shape = dataclasses.replace(shape, conv_shard_groups=csg)
    return mu.KimiLinearCacheParams(shape=shape, layers=list(st["layers"]), dtype=dt)


def build_pool(S, model, engine, case, tp_size, size, page_size, dtype):
    """SGLang's HybridLinearKVPool with its MambaPool, on the CPU."""
    mp = S["memory_pool"]
    st = model["state"]
    params = cache_params(model, tp_size, S["torch"])
    mamba = mp.MambaPool(size=int(engine.get("state_slots", 4)), spec_state_size=0, cache_params=params,
                         mamba_layer_ids=list(st["layers"]), device="cpu")
    # The layer ids the pool was given (older pools keep only their count).
    mamba.kvgeom_layer_ids = list(st["layers"])
    full = attention_layers(model)
    if model["attention"] == "mla":
        return mp.HybridLinearKVPool(size=size, dtype=dtype, page_size=page_size, head_num=1,
                                     head_dim=model["kv_lora_rank"] + model["qk_rope_head_dim"],
                                     full_attention_layer_ids=full, device="cpu", mamba_pool=mamba, use_mla=True,
                                     kv_lora_rank=model["kv_lora_rank"],
                                     qk_rope_head_dim=model["qk_rope_head_dim"])
    heads = max(1, model["total_kv_heads"] // tp_size)
    if model.get("v_head_dim") not in (None, model["head_dim"]):
        raise StateError("a hybrid model's full-attention pool has one head size (v_head_dim is not supported here)")
    return mp.HybridLinearKVPool(size=size, dtype=dtype, page_size=page_size, head_num=heads,
                                 head_dim=model["head_dim"], full_attention_layer_ids=full, device="cpu",
                                 mamba_pool=mamba)


def entries(pool):
    """SGLang's state entries of a rank in kv_args order: (field, tensor
    [slots, ...], slice_axis, layer id)."""
    mp = pool.mamba_pool
    if hasattr(mp, "_iter_transfer_state_entries"):
        return list(mp._iter_transfer_state_entries())
    # 0.5.16 and older: the pool's get_contiguous_buf_infos walks the state
    # fields of mamba_cache in order, skipping the speculative and ReplaySSM
    # buffers, one entry per (tensor, layer), every slice on the first
    # per-slot axis. state_views checks each entry's address against the KV
    # args SGLang assembled, so a walk that differs from the release's is a
    # harness error, not a verdict.
    skip = {"intermediate_ssm", "intermediate_conv_window", "replayssm_d", "replayssm_k", "replayssm_g",
            "replayssm_rawv", "replayssm_rawk", "replayssm_beta"}
    out = []
    for field, value in vars(mp.mamba_cache).items():
        if field in skip or value is None:
            continue
        for t in (value if isinstance(value, list) else [value]):
            for i, lid in enumerate(getattr(mp, "mamba_layer_ids", None) or mp.kvgeom_layer_ids):
                out.append((field, t[i], 0, lid))
    return out


def state_views(r, torch):
    out = []
    ka = r.kv_args
    ptrs = ka.state_data_ptrs[0] if ka.state_data_ptrs else []
    for (field, t, axis, lid), p in zip(entries(r.pool), ptrs):
        if t.data_ptr() != p or not t.is_contiguous():
            raise StateError(f"{r.name}: SGLang's state entries are not the KV args' state regions")
        out.append(t.view(-1).view(torch.uint8))
    return out


def state_regions(r):
    ka = r.kv_args
    if not ka.state_types:
        return []
    out = []
    csg = ka.state_conv_shard_groups[0] if getattr(ka, "state_conv_shard_groups", None) else []
    for i, (field, t, axis, lid) in enumerate(entries(r.pool)):
        out.append({
            "index": i, "what": f"{field} layer {lid}", "field": field, "layer": int(lid),
            "addr": int(ka.state_data_ptrs[0][i]), "len": int(ka.state_data_lens[0][i]),
            "item_len": int(ka.state_item_lens[0][i]), "slots": int(t.shape[0]),
            "shape": [int(x) for x in t.shape[1:]], "dtype": str(t.dtype).replace("torch.", ""),
            "dim": int(ka.state_dim_per_tensor[0][i]),
            # Before per-tensor outer counts (0.5.16 and older) every slice
            # axis is the first per-slot axis: one outer row.
            "outer_count": int(ka.state_slice_outer_counts[0][i]) if getattr(ka, "state_slice_outer_counts", None)
            else 1,
            "conv_shard_groups": csg[i] if i < len(csg) else None,
        })
    return out


def _split(total, tp, rank):
    if total % tp:
        raise StateError(f"{total} channels do not split over attention TP {tp}")
    n = total // tp
    return rank * n, n


def channel_ids(st, field, tp, rank):
    """The model channel (a global id; replicas share it) each local channel
    along a tensor's slice axis holds: conv rows are the rank's shard of each
    sub-block in turn; temporal rows are the rank's value heads."""
    if field == "temporal":
        h = st["num_v_heads"] if st["kind"] == "gdn" else st["num_heads"]
        start, n = _split(h, tp, rank)
        return [("head", start + j) for j in range(n)]
    ids = []
    for name, full in conv_blocks(st):
        if st["kind"] == "mamba2" and name in ("B", "C") and st["n_groups"] % tp:
            # SGLang adds groups so that each rank holds its heads' group
            # (configs/mamba_utils.py extra_groups_for_head_shards); the group
            # of rank r is r * n_groups // tp.
            if tp % st["n_groups"]:
                raise StateError(f"n_groups {st['n_groups']} and attention TP {tp}: neither divides the other")
            g = rank * st["n_groups"] // tp
            ids += [(name, g * st["ssm_state_size"] + j) for j in range(st["ssm_state_size"])]
            continue
        start, n = _split(full, tp, rank)
        ids += [(name, start + j) for j in range(n)]
    return ids


def pattern(seed, field, layer, cid, slot, nbytes):
    code = {"head": 0, "x": 1, "B": 2, "C": 3, "q": 4, "k": 5, "v": 6}[cid[0]]
    rng = np.random.default_rng([seed, 7, 0 if field == "conv" else 1, layer, code, cid[1], slot])
    return rng.integers(0, 256, nbytes, dtype=np.uint8)


def channel_view(view, reg):
    """One slot region as (slots, outer, channels, inner bytes)."""
    outer = reg["outer_count"]
    inner = reg["item_len"] // (outer * reg["dim"])
    return view.numpy().reshape(reg["slots"], outer, reg["dim"], inner)


def fill_prefill(r, seed, torch):
    """Seeded bytes per (field, layer, model channel, slot): replicas of a
    channel on other ranks hold the same bytes."""
    st = r.spec_model["state"]
    tp = r.engine["tp_size"]
    for view, reg in zip(state_views(r, torch), state_regions(r)):
        arr = channel_view(view, reg)
        ids = channel_ids(st, reg["field"], tp, r.rank)
        if len(ids) != reg["dim"]:
            raise StateError(f"{r.name} {reg['what']}: the model gives {len(ids)} channels, SGLang's tensor "
                             f"{reg['dim']}")
        slots, outer, dim, inner = arr.shape
        for s in range(slots):
            for c, cid in enumerate(ids):
                arr[s, :, c, :] = pattern(seed, reg["field"], reg["layer"], cid, s, outer * inner).reshape(outer,
                                                                                                           inner)


def expected_decode(r, seed, prefill_slot, decode_slot, torch):
    """Per state region of a decode rank: (region, expected bytes of its
    whole buffer given 0x5A elsewhere) under the driver's channel model."""
    st = r.spec_model["state"]
    tp = r.engine["tp_size"]
    out = []
    for view, reg in zip(state_views(r, torch), state_regions(r)):
        exp = np.full(view.numel(), 0x5A, dtype=np.uint8)
        arr = exp.reshape(reg["slots"], reg["outer_count"], reg["dim"], -1)
        inner = arr.shape[3]
        for c, cid in enumerate(channel_ids(st, reg["field"], tp, r.rank)):
            arr[decode_slot, :, c, :] = pattern(seed, reg["field"], reg["layer"], cid, prefill_slot,
                                                reg["outer_count"] * inner).reshape(reg["outer_count"], inner)
        out.append((reg, exp))
    return out


def install_recorder(S):
    """Record SGLang's slice computation (arguments and blocks) as the NIXL
    module calls it; the function itself runs unchanged."""
    nc = S["nixl_conn"]
    if getattr(nc, "_kvgeom_slice_recorder", False):
        return
    real = getattr(nc, "compute_mamba_state_slice_byte_blocks", None)
    if real is None:
        # A release before the byte-block slicer (0.5.16 and older): nothing
        # to record; its hybrid state paths are not driven.
        return

    def recorded(**kw):
        blocks = real(**kw)
        import threading
        SLICE_CALLS.append({"thread": threading.current_thread().name, **{k: (list(v) if isinstance(v, (list, tuple)) else v) for k, v in kw.items()},
                            "blocks": [list(map(int, b)) for b in blocks]})
        return blocks

    nc.compute_mamba_state_slice_byte_blocks = recorded
    nc._kvgeom_slice_recorder = True
