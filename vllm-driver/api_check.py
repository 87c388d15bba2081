"""What the driver needs from the vLLM it runs, checked before any case.

Another vLLM (a branch, an open pull request) may have moved or renamed
what the driver drives. `missing()` imports each module and looks up each
name without running anything, and returns every one that is absent with
what the driver uses it for, so that kvgeom can name them all at once
instead of failing on the first import.
"""

import importlib

NIXL = "vllm.distributed.kv_transfer.kv_connector.v1.nixl"

# (module, dotted name in it, what the driver uses it for)
REQUIRED = [
    (f"{NIXL}.worker", "NixlConnectorWorker", "the pull worker"),
    (f"{NIXL}.worker", "NixlConnectorWorker.register_kv_caches", "registration"),
    (f"{NIXL}.worker", "NixlConnectorWorker.add_remote_agent", "the handshake"),
    (f"{NIXL}.worker", "NixlConnectorWorker._read_blocks_for_req", "planning a pull"),
    (f"{NIXL}.worker", "NixlConnectorWorker.get_finished", "completion and the receive post-process"),
    (f"{NIXL}.push_worker", "NixlPushConnectorWorker", "the push worker"),
    (f"{NIXL}.push_worker", "NixlPushConnectorWorker.start_load_kv", "handing a push its request"),
    (f"{NIXL}.push_worker", "NixlPushConnectorWorker.get_transfer_results", "push completion"),
    (f"{NIXL}.push_worker", "NixlPushConnectorWorker.shutdown", "stopping a push worker's threads"),
    (f"{NIXL}.base_worker", "NixlWrapper", "replacing NIXL with the stand-in"),
    (f"{NIXL}.base_worker", "current_platform", "faking the platform"),
    (f"{NIXL}.base_worker", "get_tensor_model_parallel_rank", "faking the TP group"),
    (f"{NIXL}.base_worker", "get_tensor_model_parallel_world_size", "faking the TP group"),
    (f"{NIXL}.metadata", "NixlAgentMetadata", "the handshake metadata"),
    (f"{NIXL}.metadata", "RemoteMeta", "a request's remote side"),
    (f"{NIXL}.metadata", "ReqMeta", "a request"),
    (f"{NIXL}.metadata", "NixlConnectorMetadata", "a push step's scheduler output"),
    (f"{NIXL}.metadata", "GET_META_MSG", "answering a push handshake"),
    (f"{NIXL}.metadata", "PUSH_REG_NOTIF_PREFIX", "decode's push registration"),
    ("vllm.v1.kv_cache_interface", "KVCacheConfig", "the KV cache tensors"),
    ("vllm.v1.kv_cache_interface", "KVCacheTensor", "the KV cache tensors"),
    ("vllm.v1.kv_cache_interface", "KVCacheGroupSpec", "the KV cache groups"),
    ("vllm.v1.kv_cache_interface", "FullAttentionSpec", "full-attention layers"),
    ("vllm.v1.kv_cache_interface", "MLAAttentionSpec", "MLA layers"),
    ("vllm.v1.kv_cache_layout", "KVCacheLayout", "the page layout"),
    ("vllm.v1.worker.utils", "allocate_kv_cache", "allocating the caches as vLLM does"),
    ("vllm.config", "VllmConfig", "the engine config"),
    ("vllm.config", "ModelConfig", "the engine config"),
]


def _lookup(module, dotted):
    obj = module
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def missing(required=REQUIRED):
    """Every required name the installed vLLM lacks, as
    `module.name (purpose)` strings, in the order of `required`."""
    out = []
    modules = {}
    for module_name, dotted, purpose in required:
        if module_name not in modules:
            try:
                modules[module_name] = importlib.import_module(module_name)
            except Exception as e:  # any import failure is a missing module
                modules[module_name] = e
        module = modules[module_name]
        if isinstance(module, Exception):
            out.append(f"{module_name}.{dotted} ({purpose}; the module does not import: "
                       f"{type(module).__name__}: {module})")
            continue
        try:
            _lookup(module, dotted)
        except AttributeError:
            out.append(f"{module_name}.{dotted} ({purpose})")
    return out
