#!/usr/bin/env python3
"""Run vLLM's own functions on deployments and print what they give (the
release of the Python that runs it: 0.33.0 or 0.34.0).

For each case (model config, TP, attention backend, GPU generation,
--block-size, cache dtypes) this builds vLLM's ModelConfig from the config
file, then asks vLLM for:

- the selector's verdict on the backend (`validate_configuration`),
- the TP checks (`ModelConfig.verify_with_parallel_config`),
- the attention page of one token (`FullAttentionSpec` / `MLAAttentionSpec`),
- the mamba state (the model class's `get_mamba_state_shape_from_config` and
  `get_mamba_state_dtype_from_config`, sized by `MambaSpec`),
- the block size (`Platform.update_block_size_for_backend`, the platform's
  alignment for hybrid models),
- the kernel block (`select_common_block_size`).

What is faked: the GPU (this runs on CPU; the capability the backends ask
for is the requested generation's) and the list of attention backends in use
(vLLM reads it from the model's layers, which are not built here).
FlashInfer's TRTLLM cubins are taken as reachable.

Usage:
  scripts/vllm-derive-reference.py CASES.json > RESULTS.json
  .vllm-venvs/0.33.0/bin/python scripts/vllm-derive-reference.py --table \
      > tests/fixtures/derive/vllm-0.33.0-table.json
  .vllm-venv/bin/python scripts/vllm-derive-reference.py --table \
      > tests/fixtures/derive/vllm-0.34.0-table.json
  scripts/vllm-derive-reference.py --config C.json --tp 2 --backend FLASHINFER [--gpu sm100] [--block-size 64]

CASES.json is a list of objects with the keys config, tp, backend, gpu,
block_size (null: not given), cache_dtype, mamba_cache_dtype,
mamba_ssm_cache_dtype. The output is the same list with the results added:
logical_block, kernel_block, ppl, attention_bytes_per_token,
mamba_state_bytes and page_bytes, or refused (vLLM's message).
Run it with .vllm-venv/bin/python (the pinned 0.34.0, scripts/install-vllm.sh),
or .vllm-venvs/0.33.0/bin/python (scripts/install-vllm.sh --version 0.33.0).
"""

import argparse
import json
import os
import sys

# The derivation itself lives with the live driver, which runs it too.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "vllm-driver"))
sys.dont_write_bytecode = True  # leave no __pycache__ in the project
from block_sizes import (  # noqa: E402
    ModelCache,
    quiet,
    run_case,
    setup,
)

FIXTURES = "tests/fixtures/models"
FULL_BACKENDS = [
    ("FLASH_ATTN", "sm90"),
    ("FLASHINFER", "sm90"),
    ("FLASHINFER", "sm100"),
    ("TRITON_ATTN", "sm90"),
]
MLA_BACKENDS = [
    ("FLASHMLA", "sm90"),
    ("FLASHMLA", "sm100"),
    ("FLASH_ATTN_MLA", "sm90"),
    ("CUTLASS_MLA", "sm100"),
    ("FLASHINFER_MLA", "sm100"),
]
# Deployments vLLM refuses: a backend of the other attention kind, or on the
# wrong GPU generation.
FULL_REFUSED = [("FLASHMLA", "sm90")]
MLA_REFUSED = [("FLASH_ATTN", "sm90"), ("CUTLASS_MLA", "sm90"), ("FLASH_ATTN_MLA", "sm100")]
MLA_MODELS = {"deepseek-v3.json", "kimi-linear-48b-a3b.json"}


def case(config, tp, backend, gpu, block_size=None, **dtypes):
    return {
        "config": f"{FIXTURES}/{config}",
        "tp": tp,
        "backend": backend,
        "gpu": gpu,
        "block_size": block_size,
        "cache_dtype": dtypes.get("cache_dtype", "auto"),
        "mamba_cache_dtype": dtypes.get("mamba_cache_dtype", "auto"),
        "mamba_ssm_cache_dtype": dtypes.get("mamba_ssm_cache_dtype", "auto"),
    }


def table_cases():
    """The grid of tests/project/derive.rs: every fixture config at TP 1, 2, 4, 8 on
    every backend of its kind, without --block-size and with 32, 64, 128,
    plus refused backends and the cache-dtype options."""
    cases = []
    for config in sorted(os.listdir(FIXTURES)):
        mla = config in MLA_MODELS
        for backend, gpu in MLA_BACKENDS if mla else FULL_BACKENDS:
            for tp in (1, 2, 4, 8):
                for block in (None, 32, 64, 128):
                    cases.append(case(config, tp, backend, gpu, block))
        for backend, gpu in MLA_REFUSED if mla else FULL_REFUSED:
            cases.append(case(config, 2, backend, gpu))
    cases += [
        case("qwen3-next-80b-a3b.json", 2, "FLASHINFER", "sm90", cache_dtype="fp8"),
        case("llama-3.1-8b-test.json", 4, "FLASHINFER", "sm90", cache_dtype="fp8"),
        case("nemotron-h-8b.json", 2, "FLASHINFER", "sm90", mamba_ssm_cache_dtype="bfloat16"),
        case("jamba-1.5-mini.json", 2, "FLASH_ATTN", "sm90", mamba_cache_dtype="float32"),
        case("kimi-linear-48b-a3b.json", 2, "FLASHMLA", "sm90", mamba_ssm_cache_dtype="bfloat16"),
        case("kimi-linear-48b-a3b.json", 2, "FLASHMLA", "sm90", mamba_ssm_cache_dtype="float16"),
        case("falcon-h1-7b.json", 2, "FLASH_ATTN", "sm90", mamba_ssm_cache_dtype="float32"),
        case("qwen3-next-80b-a3b.json", 3, "FLASHINFER", "sm90"),
        case("zamba2-test.json", 3, "FLASH_ATTN", "sm90"),
    ]
    return cases


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cases", nargs="?", help="a JSON list of cases")
    parser.add_argument(
        "--table", action="store_true", help="run the grid of tests/project/derive.rs (from the project root)"
    )
    parser.add_argument("--config")
    parser.add_argument("--tp", type=int)
    parser.add_argument("--backend")
    parser.add_argument("--gpu", default="sm90")
    parser.add_argument("--block-size", type=int)
    parser.add_argument("--cache-dtype", default="auto")
    parser.add_argument("--mamba-cache-dtype", default="auto")
    parser.add_argument("--mamba-ssm-cache-dtype", default="auto")
    args = parser.parse_args()
    if args.table:
        cases = table_cases()
    elif args.cases:
        with open(args.cases) as f:
            cases = json.load(f)
    elif args.config and args.tp and args.backend:
        cases = [
            {
                "config": args.config,
                "tp": args.tp,
                "backend": args.backend,
                "gpu": args.gpu,
                "block_size": args.block_size,
                "cache_dtype": args.cache_dtype,
                "mamba_cache_dtype": args.mamba_cache_dtype,
                "mamba_ssm_cache_dtype": args.mamba_ssm_cache_dtype,
            }
        ]
    else:
        parser.error("give a cases file, or --config, --tp and --backend")
    with quiet():
        state, platform_class, capability = setup()
    models = ModelCache()
    results = []
    try:
        for case in cases:
            result = run_case(case, models, state, platform_class, capability)
            results.append({**case, **result})
    finally:
        models.close()
    json.dump(results, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
