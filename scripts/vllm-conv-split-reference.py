#!/usr/bin/env python3
"""Where vLLM 0.33.0's NIXL connector locates each Mamba2 conv sub-projection
(x | B | C) and the SSM state when prefill and decode run different TP sizes.

For each pair (model config, local TP, remote TP) this asks vLLM for:

- each engine's mamba state shapes (the model class's
  `get_mamba_state_shape_from_config`, through scripts/vllm-derive-reference.py),
- the conv decomposition (`derive_mamba_conv_split`),
- the descriptors of the remote page each local rank reads or writes
  (`NixlBaseConnectorWorker._build_mamba_remote`),
- with more remote ranks than local ones, the local page's pieces per
  source (`NixlBaseConnectorWorker._build_local_splits_from_plan`).

The worker methods run on a stand-in `self` that holds only the attributes
they read, with one SSM region based at 0 (offsets are then page offsets).
The local side is whichever engine adds the other as its remote: decode in
pull mode, prefill in push mode; the functions are the same.

Usage (from the project root, with vLLM 0.33.0's interpreter,
.vllm-venvs/0.33.0/bin/python: scripts/install-vllm.sh --version 0.33.0):
  scripts/vllm-conv-split-reference.py > tests/fixtures/derive/vllm-0.33.0-conv-split.json
"""

import contextlib
import importlib.util
import io
import json
import os
import sys
import types

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
# The NIXL connector requires the channel-first ("DS") conv state layout.
os.environ["VLLM_SSM_CONV_STATE_LAYOUT"] = "DS"

FIXTURES = "tests/fixtures/models"
# (config, local TP, remote TP). Falcon-H1-7B and Granite-4.0-H have one B/C
# group (replicated at TP > 1); Nemotron-H-8B has 8 (sharded up to TP 8).
PAIRS = [
    ("falcon-h1-7b.json", 2, 4),
    ("falcon-h1-7b.json", 4, 2),
    ("falcon-h1-7b.json", 2, 1),
    ("falcon-h1-7b.json", 1, 2),
    ("falcon-h1-7b.json", 2, 2),
    ("granite-4.0-h-test.json", 1, 4),
    ("nemotron-h-8b.json", 2, 4),
    ("nemotron-h-8b.json", 4, 2),
    ("nemotron-h-8b.json", 1, 2),
]
BACKEND = "FLASH_ATTN"


def quiet():
    return contextlib.redirect_stderr(io.StringIO())


def derive_reference():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vllm-derive-reference.py")
    spec = importlib.util.spec_from_file_location("vllm_derive_reference", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def mamba_spec(reference, models, env, config, tp):
    """vLLM's MambaSpec of one rank at `tp`, from the model class."""
    import torch
    from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum
    from vllm.v1.kv_cache_interface import MambaSpec

    result = reference.run_case(reference.case(config, tp, BACKEND, "sm90"), models, *env)
    if "refused" in result:
        raise SystemExit(f"{config} at TP {tp}: vLLM refuses the deployment: {result['refused']}")
    shapes = tuple(tuple(s) for s in result["mamba_shapes"])
    dtypes = tuple(getattr(torch, d) for d in result["mamba_dtypes"])
    return MambaSpec(
        block_size=16,
        shapes=shapes,
        dtypes=dtypes,
        mamba_type=MambaAttentionBackendEnum.MAMBA2,
    )


def tp_ratio(local, remote):
    return local // remote if local >= remote else -(remote // local)


def rows(descs):
    return [[int(r[0]), int(r[1])] for r in descs.tolist()]


def one_pair(reference, models, env, config, local_tp, remote_tp):
    import numpy as np
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker import (
        NixlBaseConnectorWorker as Worker,
    )
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.tp_mapping import TPMapping
    from vllm.distributed.kv_transfer.kv_connector.v1.ssm_conv_transfer_utils import (
        derive_mamba_conv_split,
    )
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec

    local = derive_mamba_conv_split(mamba_spec(reference, models, env, config, local_tp), local_tp)
    remote = derive_mamba_conv_split(
        mamba_spec(reference, models, env, config, remote_tp), remote_tp
    )
    t = tp_ratio(local_tp, remote_tp)
    ranks = []
    for rank in range(local_tp):
        me = types.SimpleNamespace(
            _conv_decomp=local,
            tp_rank=rank,
            _mamba_ssm_size=local.ssm_sizes,
            _ssm_region_indices=[0],
            _ple_region_index=None,
            _pack_strided_descs=Worker._pack_strided_descs,
        )
        meta = types.SimpleNamespace(
            kv_caches_base_addr=[0],
            ssm_sizes=remote.ssm_sizes,
            num_blocks=4,
            device_id=0,
            block_strides=[1 << 30],
        )
        info = types.SimpleNamespace(remote_physical_blocks_per_logical=1)
        remote_descs = rows(Worker._build_mamba_remote(me, meta, t, info))
        if t > 0:
            sources = [rank // t]
            conv_size, ssm_size = local.ssm_sizes
            local_pieces = [[[o, s] for o, s in local.local_conv_offsets] + [[conv_size, ssm_size]]]
        else:
            n = -t
            sources = list(range(rank * n, (rank + 1) * n))
            # The local list of the state sub-regions alone: FA boundary 0.
            own = Worker._build_mamba_local(
                types.SimpleNamespace(
                    _conv_decomp=local,
                    _mamba_ssm_size=local.ssm_sizes,
                    _ssm_region_indices=[0],
                    _ple_region_index=None,
                    _logical_num_blocks=4,
                    _pack_strided_descs=Worker._pack_strided_descs,
                    device_id=0,
                    block_stride_per_layer=[1 << 30],
                    _physical_blocks_per_logical_kv_block=1,
                    block_len_per_layer=[1 << 30],
                ),
                [0],
            )
            plan = TPMapping(
                source_ranks_per_group=((sources[0],), tuple(sources)),
                all_source_ranks=tuple(sources),
                rank_to_attention_slot={r: 0 for r in sources},
                rank_offset_factor=0,
            )
            splitter = types.SimpleNamespace(
                _group_spec_types=(FullAttentionSpec, MambaSpec),
                _strided_desc_starts=Worker._strided_desc_starts,
                _fa_desc_replicated=lambda starts, n_fa, ratio=1: np.zeros(len(starts), dtype=bool),
                _logical_num_blocks=4,
                _ple_region_index=None,
            )
            handles = Worker._build_local_splits_from_plan(splitter, plan, own, 0)
            local_pieces = [rows(h) for h in handles]
        ranks.append(
            {
                "rank": rank,
                "sources": sources,
                "remote": remote_descs,
                "local": local_pieces,
            }
        )
    return {
        "config": f"{FIXTURES}/{config}",
        "local_tp": local_tp,
        "remote_tp": remote_tp,
        "tp_ratio": t,
        "local_channels": list(local.local_proj_dims),
        "remote_channels": list(remote.local_proj_dims),
        "conv_rows": local.conv_rows,
        "conv_dtype_bytes": local.conv_dtype_size,
        "local_ssm_sizes": list(local.ssm_sizes),
        "remote_ssm_sizes": list(remote.ssm_sizes),
        "ranks": ranks,
    }


def main():
    reference = derive_reference()
    with quiet():
        env = reference.setup()
        import vllm.model_executor.layers.mamba.mamba_utils as mamba_utils

    assert mamba_utils.is_conv_state_dim_first(), "the DS conv layout is required"
    models = reference.ModelCache()
    try:
        out = [one_pair(reference, models, env, *pair) for pair in PAIRS]
    finally:
        models.close()
    json.dump(out, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
