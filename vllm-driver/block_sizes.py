"""vLLM 0.33.0's own block-size derivation for one engine of a deployment.

Given a model config, TP, attention backend, GPU generation, --block-size
and the cache dtypes, this builds vLLM's ModelConfig from the config file
and asks vLLM for:

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

Used by scripts/vllm-derive-reference.py (the tables of tests/project/derive.rs) and
by driver.py (`block_checks` of a batch: what vLLM chooses for a geometry
that names its model config, compared by kvgeom with its own derivation).
"""

import contextlib
import io
import json
import os
import shutil
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")

# What setup() replaced, for restore(): (owner, attribute, old value).
_REPLACED = []
_ABSENT = object()

CAPABILITY = {"sm90": (9, 0), "sm100": (10, 0)}


def quiet():
    """Silence vLLM's and torch's start-up chatter on stderr."""
    return contextlib.redirect_stderr(io.StringIO())


def setup():
    """Fake the GPU: the capability checks answer for state["gpu"] (set per
    case by run_case). restore() undoes it."""
    with quiet():
        import vllm.platforms as platforms
        from vllm.platforms.interface import DeviceCapability, Platform

        import vllm.utils.flashinfer as fi_utils
    platform = platforms.current_platform
    state = {"gpu": "sm90"}

    def capability(device_id=0):
        major, minor = CAPABILITY[state["gpu"]]
        return DeviceCapability(major=major, minor=minor)

    def family(cap, device_id=0):
        return capability().to_int() // 10 == cap // 10

    def exact(cap, device_id=0):
        return capability().to_int() == cap

    for owner, name, value in (
        (platform, "get_device_capability", capability),
        (platform, "is_device_capability_family", family),
        (platform, "is_device_capability", exact),
        # A deployment reaches NVIDIA's artifactory for the TRTLLM cubins.
        (fi_utils, "has_nvidia_artifactory", lambda: True),
    ):
        _REPLACED.append((owner, name, owner.__dict__.get(name, _ABSENT)))
        setattr(owner, name, value)
    return state, Platform, DeviceCapability


def restore():
    """Undo setup(): the platform's own capability checks again."""
    while _REPLACED:
        owner, name, value = _REPLACED.pop()
        if value is _ABSENT:
            delattr(owner, name)
        else:
            setattr(owner, name, value)


class ModelCache:
    """One vLLM ModelConfig per config file (building one takes seconds)."""

    def __init__(self):
        self.models = {}
        self.configs = {}
        self.dirs = []

    def get(self, path):
        if path not in self.models:
            from vllm.config import ModelConfig

            folder = tempfile.mkdtemp(prefix="kvgeom-model-")
            self.dirs.append(folder)
            shutil.copy(path, os.path.join(folder, "config.json"))
            with quiet():
                self.models[path] = ModelConfig(model=folder, skip_tokenizer_init=True)
        return self.models[path]

    def close(self):
        for folder in self.dirs:
            shutil.rmtree(folder, ignore_errors=True)


def backend_class(name):
    """vLLM's backend class. Two modules need CUDA at import time on a CPU
    machine: CUTLASS MLA allocates a workspace on the GPU, FlashAttention MLA
    imports kernels that exist only on CUDA. Those are stood in for while the
    module loads; the class methods asked here do not use them."""
    import torch

    import vllm.utils.platform_utils as platform_utils
    import vllm.v1.attention.backends.fa_utils as fa_utils
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    for missing in ("flash_attn_varlen_func", "get_scheduler_metadata"):
        if not hasattr(fa_utils, missing):
            setattr(fa_utils, missing, None)
    real_empty, real_units = torch.empty, platform_utils.num_compute_units

    def empty_off_gpu(*args, **kwargs):
        if str(kwargs.get("device", "")).startswith("cuda"):
            kwargs["device"] = "meta"
        return real_empty(*args, **kwargs)

    torch.empty = empty_off_gpu
    platform_utils.num_compute_units = lambda device_id=0: 1
    try:
        with quiet():
            return AttentionBackendEnum[name].get_class()
    finally:
        torch.empty, platform_utils.num_compute_units = real_empty, real_units


def checked_reasons(backend, config, model, kv_cache_dtype, case, major, minor, DeviceCapability):
    from vllm.config.vllm import set_current_vllm_config

    with set_current_vllm_config(config):
        return backend.validate_configuration(
            head_size=model.get_head_size(),
            dtype=model.dtype,
            kv_cache_dtype=kv_cache_dtype,
            block_size=case.get("block_size"),
            use_mla=model.use_mla,
            has_sink=False,
            use_sparse=False,
            use_mm_prefix=False,
            use_per_head_quant_scales=False,
            device_capability=DeviceCapability(major=major, minor=minor),
            attn_type="decoder",
        )


def run_case(case, models, state, Platform, DeviceCapability):
    from vllm.config import CacheConfig, DeviceConfig, ParallelConfig, VllmConfig
    from vllm.config.vllm import set_current_vllm_config
    from vllm.model_executor.models import ModelRegistry
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP
    from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        MambaSpec,
        MLAAttentionSpec,
        get_kv_quant_mode,
    )
    from vllm.v1.worker.utils import select_common_block_size

    state["gpu"] = case.get("gpu", "sm90")
    model = models.get(case["config"])
    tp = case["tp"]
    parallel = ParallelConfig(tensor_parallel_size=tp)
    cache_kwargs = {
        "cache_dtype": case.get("cache_dtype", "auto"),
        "mamba_cache_dtype": case.get("mamba_cache_dtype", "auto"),
        "mamba_ssm_cache_dtype": case.get("mamba_ssm_cache_dtype", "auto"),
    }
    if case.get("block_size") is not None:
        cache_kwargs["block_size"] = case["block_size"]
    cache = CacheConfig(**cache_kwargs)
    try:
        model.verify_with_parallel_config(parallel)
    except Exception as e:  # vLLM raises ValueError here
        return {"refused": str(e)}
    key = (case["config"], tp)
    if key not in models.configs:
        with quiet():
            models.configs[key] = VllmConfig(
                model_config=model,
                cache_config=CacheConfig(),
                parallel_config=parallel,
                device_config=DeviceConfig(device="cpu"),
            )
    config = models.configs[key]
    model = config.model_config
    # VllmConfig ran the CPU platform's block-size update; start again from
    # the user's values as a CUDA engine would.
    config.cache_config = cache = CacheConfig(**cache_kwargs)
    config.parallel_config = parallel
    arch = model.architecture
    if arch in MODELS_CONFIG_MAP:
        MODELS_CONFIG_MAP[arch].verify_and_update_config(config)

    backend = backend_class(case["backend"])
    major, minor = CAPABILITY[state["gpu"]]
    kv_cache_dtype = cache.cache_dtype
    dtype = (
        model.dtype
        if kv_cache_dtype == "auto"
        else STR_DTYPE_TO_TORCH_DTYPE[kv_cache_dtype]
    )
    # The selector's generic checks. `supports_combination` is left out: on
    # a CPU machine it reports the missing GPU kernels (vllm._flashmla_C,
    # the FlashAttention build), not a property of the deployment.
    combination = backend.__dict__.get("supports_combination")
    backend.supports_combination = classmethod(lambda cls, *a, **k: None)
    try:
        reasons = checked_reasons(backend, config, model, kv_cache_dtype, case, major, minor, DeviceCapability)
    finally:
        if combination is None:
            del backend.supports_combination
        else:
            backend.supports_combination = combination
    if reasons:
        return {
            "refused": f"Selected backend AttentionBackendEnum.{case['backend']} is not "
            f"valid for this configuration. Reason: {reasons}"
        }

    kv_heads = model.get_num_kv_heads(parallel)
    spec_class = MLAAttentionSpec if model.use_mla else FullAttentionSpec
    extra = {"cache_dtype_str": kv_cache_dtype} if model.use_mla else {}
    attention_bytes = spec_class(
        block_size=1,
        num_kv_heads=kv_heads,
        head_size=model.get_head_size(),
        dtype=dtype,
        kv_quant_mode=get_kv_quant_mode(kv_cache_dtype),
        **extra,
    ).page_size_bytes

    mamba_bytes = None
    shapes = dtypes = None
    if model.is_hybrid:
        model_class, _ = ModelRegistry.resolve_model_cls(arch, model_config=model)
        try:
            shapes = model_class.get_mamba_state_shape_from_config(config)
            dtypes = model_class.get_mamba_state_dtype_from_config(config)
        except (AssertionError, ValueError) as e:
            return {"refused": str(e)}
        mamba_bytes = MambaSpec(shapes=shapes, dtypes=dtypes, block_size=-1).page_size_bytes

    class CudaLike(Platform):
        @classmethod
        def _find_non_ssm_backends(cls, vllm_config):
            return [backend]

    try:
        with set_current_vllm_config(config):
            CudaLike.update_block_size_for_backend(config)
            logical = cache.block_size
            kernel = select_common_block_size(logical, [backend])
    except (AssertionError, ValueError) as e:
        return {"refused": str(e)}
    return {
        "logical_block": logical,
        "kernel_block": kernel,
        "ppl": logical // kernel,
        "attention_bytes_per_token": attention_bytes,
        "mamba_state_bytes": mamba_bytes,
        "page_bytes": logical * attention_bytes,
        "mamba_shapes": [list(s) for s in shapes] if shapes else None,
        "mamba_dtypes": [str(d).replace("torch.", "") for d in dtypes] if dtypes else None,
    }


def run_checks(checks):
    """The driver's `block_checks`: for each check (`id`, and per engine
    `prefill` / `decode` a case as run_case takes it), what vLLM chooses:
    `logical_block`, `kernel_block`, `page_bytes`, or `refused` (vLLM's
    message) or `error` (the derivation itself failed). Each distinct engine
    case runs once; the platform's patches are undone afterwards."""
    with quiet():
        state, platform_class, capability = setup()
    models = ModelCache()
    done = {}
    out = []
    try:
        for check in checks:
            entry = {"id": check["id"]}
            for side in ("prefill", "decode"):
                case = check[side]
                key = json.dumps(case, sort_keys=True)
                if key not in done:
                    try:
                        result = run_case(case, models, state, platform_class, capability)
                    except Exception as e:  # reported per engine, never raised
                        result = {"error": f"{type(e).__name__}: {e}"}
                    done[key] = {
                        k: result[k]
                        for k in ("logical_block", "kernel_block", "page_bytes", "refused", "error")
                        if result.get(k) is not None
                    }
                entry[side] = done[key]
            out.append(entry)
    finally:
        models.close()
        restore()
    return out
