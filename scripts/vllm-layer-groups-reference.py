#!/usr/bin/env python3
"""How vLLM 0.33.0 groups a hybrid model's layers into KV-cache groups, and
which layer slots (shared tensors) hold a layer of each kind.

For each row (attention layers, mamba layers, which kind comes first) this
builds one KV-cache spec per layer with a common page size and asks vLLM's
`_get_kv_cache_groups_uniform_page_size` (v1/core/kv_cache_planning.py) for
the groups, then `get_kv_cache_config_from_groups` (with a stand-in engine
config with the LBHNC layout the NIXL connector asks for) for the tensors: layer
`l` of every group lies at the same offset (`l x layer_stride`), so slot `l`
holds a layer of a kind when some group of that kind has more than `l`
layers.

The rows are the layer counts of the model configs in tests/fixtures/models/
(as `kvgeom derive` reads them) and a few counts whose groups leave slots
without a mamba layer.

Usage (from the project root, with vLLM 0.33.0's interpreter,
.vllm-venvs/0.33.0/bin/python: scripts/install-vllm.sh --version 0.33.0):
  scripts/vllm-layer-groups-reference.py > tests/fixtures/derive/vllm-0.33.0-layer-groups.json
"""

import contextlib
import io
import json
import os
import sys

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

# (attention layers, mamba layers, mamba first)
ROWS = [
    (12, 36, True),  # Qwen3-Next-80B-A3B
    (4, 28, True),  # Jamba-1.5-Mini
    (7, 20, True),  # Kimi-Linear-48B-A3B
    (44, 44, False),  # Falcon-H1-7B (both in every layer)
    (4, 24, True),  # Nemotron-H-8B
    (4, 27, True),  # Nemotron-Nano-v2 (test config)
    (4, 36, True),  # Granite-4.0-H (test config)
    (9, 54, False),  # Zamba2 (test config)
    (7, 15, True),
    (9, 7, False),
    (8, 13, False),
    (13, 20, False),
]


def main():
    with contextlib.redirect_stderr(io.StringIO()):
        import torch

        import types

        from vllm.config import CacheConfig
        from vllm.v1.core.kv_cache_planning import (
            _get_kv_cache_groups_uniform_page_size,
            get_kv_cache_config_from_groups,
        )
        from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec

        attention = FullAttentionSpec(
            block_size=16, num_kv_heads=1, head_size=64, dtype=torch.bfloat16
        )
        page = attention.page_size_bytes
        mamba = MambaSpec(
            block_size=16,
            shapes=((8, 3), (4, 4)),
            dtypes=(torch.bfloat16, torch.bfloat16),
            page_size_padded=page,
        )
        # What get_kv_cache_config_from_groups reads of the engine config;
        # the layout as the engine core resolves it for the NIXL connector.
        cache = CacheConfig()
        cache.kv_cache_layout = "LBHNC"
        config = types.SimpleNamespace(
            attention_config=types.SimpleNamespace(hisparse_config=None),
            cache_config=cache,
        )
    out = []
    for a, m, mamba_first in ROWS:
        kinds = ["mamba"] * m + ["attention"] * a if mamba_first else ["attention"] * a + ["mamba"] * m
        specs = {
            f"model.layers.{i}.{kind}": attention if kind == "attention" else mamba
            for i, kind in enumerate(kinds)
        }
        with contextlib.redirect_stderr(io.StringIO()):
            groups = _get_kv_cache_groups_uniform_page_size(specs)
            tensors = get_kv_cache_config_from_groups(config, groups, 64 * page).kv_cache_tensors
        layer_groups = [
            {
                "kind": "attention" if isinstance(g.kv_cache_spec, FullAttentionSpec) else "mamba",
                "layers": len(g.layer_names),
            }
            for g in groups
        ]
        stride = {t.layer_stride for t in tensors}
        offsets = {t.offset for t in tensors}
        assert len(stride) == 1 and offsets == {0}, "every group's layer l at l x layer_stride"
        slots = max(g["layers"] for g in layer_groups)
        out.append(
            {
                "attention_layers": a,
                "mamba_layers": m,
                "mamba_first": mamba_first,
                "groups": layer_groups,
                "slots": slots,
                "attention_slots": max(g["layers"] for g in layer_groups if g["kind"] == "attention"),
                "mamba_slots": max(g["layers"] for g in layer_groups if g["kind"] == "mamba"),
            }
        )
    json.dump(out, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
