#!/usr/bin/env python3
"""Run SGLang 0.5.23's own config and pool code on the shipped model configs
and print what it gives, as the reference `kvgeom derive --stack sglang` is
checked against (tests/project/derive_sglang.rs).

For each config in tests/fixtures/models/ and each attention TP of 1, 2, 4
and 8 this builds SGLang's `ModelConfig` from the config file (SGLang's own
config classes for the hybrid families) with that attention TP published in
SGLang's runtime context, then asks SGLang for:

- the KV heads over all ranks and per rank (`get_total_num_kv_heads`,
  `get_num_kv_heads`), K's and V's head dims, or MLA's latent
  (`kv_lora_rank`, `qk_rope_head_dim`);
- the full-attention and linear-attention layer ids (the config's
  `full_attention_layer_ids` and `mamba_layer_ids` / `linear_layer_ids`);
- the state shape (the config's `mamba2_cache_params`), and from a one-layer
  `MambaPool` built on it: each state tensor's shape per slot and dtype, and
  what the pool tells the transfer about it (`get_state_dim_per_tensor`,
  `get_state_slice_outer_counts`, `get_state_conv_shard_groups`, and the
  slice axis).

Where SGLang cannot build a deployment the entry holds `refused` (SGLang's
message); a config whose architecture SGLang has no model for holds
`unsupported`.

Usage:
  .sglang-venv/bin/python scripts/sglang-derive-reference.py > tests/fixtures/derive/sglang-0.5.23-table.json
"""

import contextlib
import io
import json
import logging
import os
import shutil
import sys
import tempfile
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")

sys.dont_write_bytecode = True  # leave no __pycache__ in the project
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)

FIXTURES = "tests/fixtures/models"
TPS = [1, 2, 4, 8]


def sglang_model_classes():
    """Every architecture SGLang has a model class for, read from its model
    modules' `EntryClass` declarations without importing them (importing
    them needs GPU kernels)."""
    import ast
    import sglang.srt.models as models

    names = set()
    folder = list(models.__path__)[0]
    for file in os.listdir(folder):
        if not file.endswith(".py"):
            continue
        with open(os.path.join(folder, file)) as f:
            tree = ast.parse(f.read())
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "EntryClass" for t in node.targets
            ):
                value = node.value
                items = value.elts if isinstance(value, (ast.List, ast.Tuple)) else [value]
                names.update(i.id for i in items if isinstance(i, ast.Name))
    return names


@contextlib.contextmanager
def attention_tp(tp):
    """SGLang's runtime context with an attention TP of `tp`, as a scheduler
    publishes it."""
    from sglang.srt.runtime_context import SpawnRanks, publish, reset_context
    from sglang.srt.server_args import ServerArgs

    reset_context()
    publish(
        ServerArgs(model_path="dummy", tp_size=tp, device="cuda"),
        role="scheduler",
        ranks=SpawnRanks(world_rank=0, dp_rank=None),
    )
    try:
        yield
    finally:
        reset_context()


def dtype_name(dtype):
    return str(dtype).removeprefix("torch.")


def state_of(model_config):
    """The state tensors SGLang's MambaPool keeps for one linear layer."""
    from sglang.srt.mem_cache.memory_pool import MambaPool

    params = model_config.hf_config.mamba2_cache_params
    one_layer = type(params)(shape=params.shape, layers=[0], dtype=params.dtype)
    pool = MambaPool(
        size=1, spec_state_size=0, cache_params=one_layer, mamba_layer_ids=[0], device="cpu"
    )
    entries = list(pool._iter_transfer_state_entries())
    dims = pool.get_state_dim_per_tensor()
    outer = pool.get_state_slice_outer_counts()
    groups = pool.get_state_conv_shard_groups()
    tensors = []
    for (field, tensor, axis, _), dim, count, group in zip(entries, dims, outer, groups):
        tensors.append(
            {
                "name": field,
                "shape": list(tensor.shape[1:]),
                "dtype": dtype_name(tensor.dtype),
                "slice_axis": axis,
                "dim_per_tensor": dim,
                "outer_count": count,
                "conv_shard_groups": group,
            }
        )
    return {
        "conv_kernel": params.shape.conv_kernel,
        "tensors": tensors,
    }


def entry(path, tp, supported):
    from sglang.srt.configs.model_config import AttentionArch, ModelConfig
    import sglang.srt.configs.qwen3_next as qwen3_next

    # Qwen3-Next's config changes its head counts when SGLang runs on a CPU;
    # the table is what a GPU deployment gets.
    qwen3_next._is_cpu = False
    with open(path) as f:
        arch = (json.load(f).get("architectures") or [""])[0]
    if arch not in supported:
        return {"unsupported": f"SGLang 0.5.23 has no model class for {arch}"}
    folder = tempfile.mkdtemp()
    try:
        shutil.copy(path, os.path.join(folder, "config.json"))
        with attention_tp(tp), contextlib.redirect_stdout(io.StringIO()):
            try:
                mc = ModelConfig(model_path=folder)
                hf = mc.hf_config
                out = {}
                if mc.attention_arch == AttentionArch.MLA:
                    out["attention"] = {
                        "kind": "mla",
                        "kv_lora_rank": mc.kv_lora_rank,
                        "qk_rope_head_dim": mc.qk_rope_head_dim,
                    }
                else:
                    out["attention"] = {
                        "kind": "mha",
                        "total_kv_heads": mc.get_total_num_kv_heads(),
                        "kv_heads_per_rank": mc.get_num_kv_heads(tp),
                        "head_dim": mc.head_dim,
                        "v_head_dim": mc.v_head_dim,
                    }
                if hasattr(hf, "mamba2_cache_params"):
                    linear = getattr(hf, "mamba_layer_ids", None)
                    if linear is None:
                        linear = hf.linear_layer_ids
                    out["attention_layers"] = list(hf.full_attention_layer_ids)
                    out["linear_layers"] = list(linear)
                    out["state"] = state_of(mc)
                else:
                    out["attention_layers"] = list(range(mc.num_hidden_layers))
                    out["linear_layers"] = []
                return out
            except (AssertionError, ValueError, RuntimeError) as e:
                return {"refused": str(e) or type(e).__name__}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main():
    supported = sglang_model_classes()
    table = {}
    for name in sorted(os.listdir(FIXTURES)):
        if not name.endswith(".json"):
            continue
        path = os.path.join(FIXTURES, name)
        table[name] = {str(tp): entry(path, tp, supported) for tp in TPS}
    json.dump({"sglang": "0.5.23", "models": table}, sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
