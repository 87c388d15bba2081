"""What the driver needs from the vLLM it runs, checked before any case.

Another vLLM (an older release, a branch, an open pull request) may have
moved, renamed or never had what the driver drives. `missing()` imports
each module and looks up each name without running anything, and returns
every one that is absent with what the driver uses it for, so that kvgeom
can name them all at once instead of failing on the first import.

Three kinds of entry:

- `REQUIRED`: modules, classes, functions and methods, looked up by name.
- `ATTRS`: attributes of a vLLM object that the driver reads, writes or
  replaces (most of them private, set in `__init__`), looked up on the
  class (a method, a property) or else found as `self.<name>` in the
  source of the class or one of its bases; nothing is built.
- `FIELDS`: fields of vLLM's request metadata that the driver passes by
  keyword when it builds a request itself (`--requests direct`), looked up
  among the class's dataclass fields or constructor parameters.
- `SIGNATURES`: the shape of what the driver builds, calls or replaces:
  the keywords it passes to vLLM's constructors (`ModelRunnerOutput`,
  `KVCacheConfig`, the scheduler), the parameters, in order, of the
  methods it calls positionally or patches with a function of its own;
  and `post_process_entry_shape()`, the type of each receive post-process
  entry (`(group, blocks, covered)` with `covered` an int or a range, or
  `(blocks, covered)`). A changed one is named like an absent name, so a
  release that reshapes what the driver feeds it stops the batch (exit 2)
  before any case runs, instead of failing inside every case.
- each entry's `need`: `"all"` (every case), `"pull"` or `"push"` (only
  when the batch has a case of that mode), or `"optional"` (the driver
  checks for it where it uses it and does without: `optional()` says what
  is lost).

Every private name the driver touches on a vLLM object is in one of these
tables; `tests/live/live_vllm.rs` scans the driver's files and fails when one
is not, and `tests/live/api_check_fields.rs` does the same for the request
fields the driver passes.
"""

import importlib
import inspect
import re

NIXL = "vllm.distributed.kv_transfer.kv_connector.v1.nixl"
BASE = f"{NIXL}.base_worker"
PULL = f"{NIXL}.worker"
PUSH = f"{NIXL}.push_worker"

# (module, dotted name in it, need, what the driver uses it for)
REQUIRED = [
    (PULL, "NixlConnectorWorker", "all", "the pull worker"),
    (PULL, "NixlConnectorWorker.register_kv_caches", "all", "registration"),
    (PULL, "NixlConnectorWorker.add_remote_agent", "pull", "the handshake"),
    (PULL, "NixlConnectorWorker._read_blocks_for_req", "pull", "planning a pull"),
    (PULL, "NixlConnectorWorker.get_finished", "pull", "completion and the receive post-process"),
    (PULL, "NixlConnectorWorker.get_transfer_results", "optional",
     "telling a failed receive (failed_recving) from a finished one; get_finished counts both as finished"),
    (PULL, "NixlConnectorWorker._logical_to_kernel_block_ids", "pull", "a request's kernel block ids"),
    (PULL, "NixlConnectorWorker.shutdown", "all", "releasing a case's handles and registrations"),
    (PUSH, "NixlPushConnectorWorker", "push", "the push worker"),
    (PUSH, "NixlPushConnectorWorker.start_load_kv", "push", "handing a push its request"),
    (PUSH, "NixlPushConnectorWorker.get_transfer_results", "push", "push completion"),
    (PUSH, "NixlPushConnectorWorker.shutdown", "push", "stopping a push worker's threads"),
    # Module globals the driver replaces.
    (BASE, "NixlWrapper", "all", "replacing NIXL with the stand-in"),
    (BASE, "check_nixl_version", "optional", "skipped for the stand-in (patched only where vLLM has it)"),
    (BASE, "current_platform", "all", "faking the platform"),
    (BASE, "get_tensor_model_parallel_rank", "all", "faking the TP group"),
    (BASE, "get_tensor_model_parallel_world_size", "all", "faking the TP group"),
    (BASE, "get_current_attn_backends", "all", "faking the attention backend"),
    (BASE, "zmq_ctx", "push", "answering a push handshake in process"),
    ("vllm.utils.torch_utils", "PIN_MEMORY", "optional", "switching pinned staging memory off"),
    ("vllm.utils.torch_utils", "is_pin_memory_available", "optional",
     "switching pinned staging memory off (releases before PIN_MEMORY)"),
    (f"{NIXL}.metadata", "NixlAgentMetadata", "all", "the handshake metadata"),
    (f"{NIXL}.metadata", "RemoteMeta", "all", "a request's remote side"),
    (f"{NIXL}.metadata", "ReqMeta", "all", "a request"),
    (f"{NIXL}.metadata", "NixlConnectorMetadata", "push", "a push step's scheduler output"),
    (f"{NIXL}.metadata", "GET_META_MSG", "push", "answering a push handshake"),
    (f"{NIXL}.metadata", "PUSH_REG_NOTIF_PREFIX", "push", "decode's push registration"),
    ("vllm.distributed.kv_transfer.kv_connector.v1.ssm_conv_transfer_utils", "derive_mamba_conv_split", "optional",
     "checking the conv decomposition of a hybrid (hybrid cases need it)"),
    ("vllm.v1.kv_cache_interface", "KVCacheConfig", "all", "the KV cache tensors"),
    ("vllm.v1.kv_cache_interface", "KVCacheTensor", "all", "the KV cache tensors"),
    ("vllm.v1.kv_cache_interface", "KVCacheGroupSpec", "all", "the KV cache groups"),
    ("vllm.v1.kv_cache_interface", "FullAttentionSpec", "all", "full-attention layers"),
    ("vllm.v1.kv_cache_interface", "MLAAttentionSpec", "all", "MLA layers"),
    ("vllm.v1.kv_cache_interface", "MambaSpec", "optional", "mamba layers (hybrid cases need it)"),
    ("vllm.v1.kv_cache_layout", "KVCacheLayout", "all", "the page layout"),
    ("vllm.v1.worker.utils", "allocate_kv_cache", "all", "allocating the caches as vLLM does"),
    ("vllm.config", "VllmConfig", "all", "the engine config"),
    ("vllm.config", "ModelConfig", "all", "the engine config"),
]

# `requests: "scheduler"` (place_case.py, scheduler_side.py and the run
# phase): needs "scheduler-<phase>" (every such case of the phase) or
# "scheduler-<phase>-<mode>" (such cases of that mode), phase "place" or "run".
CONN = f"{NIXL}.connector"
SCHED = "vllm.v1.core.kv_cache_utils"
REQUIRED += [
    # The place phase: vLLM's scheduler and the connector's scheduler half.
    ("vllm.config", "SchedulerConfig.get_scheduler_cls", "scheduler-place", "the scheduler class the engine core runs"),
    ("vllm.config", "KVTransferConfig", "scheduler-place", "the engines' connector and engine ids"),
    ("vllm", "SamplingParams", "scheduler-place", "a request that ends after one token"),
    ("vllm.utils.hashing", "sha256", "scheduler-place", "the prefix cache's block hashes"),
    (SCHED, "FreeKVCacheBlockQueue", "scheduler-place", "putting a reused pool back in block order"),
    (SCHED, "get_request_block_hasher", "scheduler-place", "the prefix cache's block hashes"),
    (SCHED, "init_none_hash", "scheduler-place", "the prefix cache's block hashes"),
    (SCHED, "resolve_kv_cache_block_sizes", "scheduler-place", "the scheduler's and the hashes' block sizes"),
    ("vllm.v1.outputs", "KVConnectorOutput", "scheduler-place", "finished transfers reported to a scheduler"),
    ("vllm.v1.outputs", "ModelRunnerOutput", "scheduler-place", "the model runner's output of a step"),
    ("vllm.v1.request", "Request", "scheduler-place", "the case's requests"),
    ("vllm.v1.request", "RequestStatus", "scheduler-place", "telling a waiting request from a finished one"),
    ("vllm.v1.structured_output", "StructuredOutputManager", "scheduler-place", "building the scheduler"),
    ("vllm.v1.kv_cache_interface", "KVCacheConfig", "scheduler-place", "the schedulers' KV-cache groups"),
    (CONN, "NixlPullConnector", "scheduler-place-pull", "the pull connector's scheduler half"),
    (CONN, "NixlPushConnector", "scheduler-place-push", "the push connector's scheduler half"),
    (CONN, "NixlPullConnector.get_num_new_matched_tokens", "scheduler-place-pull", "decode's tokens to load"),
    (CONN, "NixlPullConnector.update_state_after_alloc", "scheduler-place-pull", "decode's blocks to load into"),
    (CONN, "NixlPullConnector.build_connector_meta", "scheduler-place-pull", "the metadata decode's workers get"),
    (CONN, "NixlPullConnector.request_finished", "scheduler-place-pull", "prefill's kv_transfer_params"),
    (CONN, "NixlPushConnector.get_num_new_matched_tokens", "scheduler-place-push", "decode's tokens to receive"),
    (CONN, "NixlPushConnector.update_state_after_alloc", "scheduler-place-push", "decode's push registration"),
    (CONN, "NixlPushConnector.build_connector_meta", "scheduler-place-push", "the metadata both engines' workers get"),
    (CONN, "NixlPushConnector.request_finished", "scheduler-place-push", "prefill's finished blocks"),
    # The run phase: the workers as the model runner drives them.
    ("vllm.distributed.kv_transfer.kv_connector.v1.base", "KVConnectorRole", "scheduler-run",
     "building a connector in its worker role"),
    (CONN, "NixlPullConnector.register_kv_caches", "scheduler-run-pull", "registration through the connector"),
    (CONN, "NixlPullConnector.bind_connector_metadata", "scheduler-run-pull", "handing a step's metadata to the worker"),
    (CONN, "NixlPullConnector.start_load_kv", "scheduler-run-pull", "starting decode's reads"),
    (CONN, "NixlPullConnector.get_finished", "scheduler-run-pull", "completion (without get_transfer_results)"),
    (CONN, "NixlPullConnector.get_transfer_results", "optional", "failed receives (completion by get_finished without it)"),
    (CONN, "NixlPullConnector.clear_connector_metadata", "scheduler-run-pull", "ending a step"),
    (CONN, "NixlPushConnector.register_kv_caches", "scheduler-run-push", "registration through the connector"),
    (CONN, "NixlPushConnector.bind_connector_metadata", "scheduler-run-push", "handing a step's metadata to the worker"),
    (CONN, "NixlPushConnector.start_load_kv", "scheduler-run-push", "handing the push its request on both engines"),
    (CONN, "NixlPushConnector.get_transfer_results", "scheduler-run-push", "push completion"),
    (CONN, "NixlPushConnector.clear_connector_metadata", "scheduler-run-push", "ending a step"),
]

# (module, class, attribute, need, what the driver does with it)
ATTRS = [
    (PULL, "NixlConnectorWorker", "xfer_handshake_metadata", "all", "the prefill rank's handshake payload"),
    (PULL, "NixlConnectorWorker", "nixl_wrapper", "all", "the worker's NIXL agent"),
    (PULL, "NixlConnectorWorker", "_remote_agents", "pull", "recording a finished handshake"),
    (PULL, "NixlConnectorWorker", "_engine_clock_offset", "pull", "recording a finished handshake"),
    (PULL, "NixlConnectorWorker", "_physical_blocks_per_logical_kv_block", "pull", "a request's kernel block ids"),
    (PULL, "NixlConnectorWorker", "_recving_metadata", "pull", "handing decode its request"),
    (PULL, "NixlConnectorWorker", "_recving_transfers", "pull", "waiting for real NIXL's reads"),
    (PULL, "NixlConnectorWorker", "post_process_device_kv_on_receive", "optional",
     "recording the receive post-process calls (patched)"),
    (PULL, "NixlConnectorWorker", "_zero_region_blocks", "optional",
     "recording the region-mapped zeroing calls (patched)"),
    (PULL, "NixlConnectorWorker", "_group_spec_types", "optional",
     "the attention group of a receive post-process entry, in releases whose entries name none (compat.py)"),
    (PULL, "NixlConnectorWorker", "kv_caches_base_addr", "optional", "the v1 trace's base addresses"),
    (PULL, "NixlConnectorWorker", "dst_num_blocks", "optional", "the v1 trace's handshakes"),
    (PULL, "NixlConnectorWorker", "dst_region_num_blocks", "optional", "the v1 trace's handshakes"),
    (PUSH, "NixlPushConnectorWorker", "_log_failure", "push", "recording what vLLM only logs (patched)"),
    (PUSH, "NixlPushConnectorWorker", "add_remote_agent", "push", "recording the handshakes (patched)"),
    (PUSH, "NixlPushConnectorWorker", "_add_notif_only_remote_agent", "push", "recording the handshakes (patched)"),
    (PUSH, "NixlPushConnectorWorker", "_do_start_push_kv", "push", "recording a writer thread's exception (patched)"),
    (PUSH, "NixlPushConnectorWorker", "_send_registration_to_p", "push",
     "recording a writer thread's exception (patched)"),
    (PUSH, "NixlPushConnectorWorker", "_handshake_futures", "push", "telling a settled push from a busy one"),
    (PUSH, "NixlPushConnectorWorker", "_handshake_initiation_executor", "push", "telling a settled push from a busy one"),
    (PUSH, "NixlPushConnectorWorker", "_reg_send_inbox", "push", "telling a settled push from a busy one"),
    (PUSH, "NixlPushConnectorWorker", "_deferred_push_inbox", "push", "telling a settled push from a busy one"),
    (PUSH, "NixlPushConnectorWorker", "_finished_blocks_inbox", "push", "telling a settled push from a busy one"),
    (PUSH, "NixlPushConnectorWorker", "_pending_completion_notifs", "push", "telling a settled push from a busy one"),
    (PUSH, "NixlPushConnectorWorker", "_push_writer_thread", "push", "telling a settled push from a busy one"),
    (PUSH, "NixlPushConnectorWorker", "_push_writer_wake", "push", "telling a settled push from a busy one"),
    (PUSH, "NixlPushConnectorWorker", "_push_finished_blocks", "push", "naming what a hung push holds"),
    (PUSH, "NixlPushConnectorWorker", "_pending_d_registrations", "push", "naming what a hung push holds"),
    (PUSH, "NixlPushConnectorWorker", "consumer_notification_counts_by_req", "push", "naming what a hung push holds"),
    (PUSH, "NixlPushConnectorWorker", "_send_heartbeats", "optional",
     "a step's heartbeats held until its push registrations reached the writer thread (patched; a release "
     "without heartbeats has nothing to order)"),
    (PUSH, "NixlPushConnectorWorker", "_nixl_handshake", "optional",
     "test_push_ordering.py delays it to force the other order of the two handshakes"),
]
ATTRS += [
    ("vllm.v1.core.sched.scheduler", "Scheduler", "connector", "scheduler-place", "the scheduler's connector"),
    (CONN, "NixlPullConnector", "connector_scheduler", "scheduler-place-pull", "watching the scheduler half"),
    (CONN, "NixlPushConnector", "connector_scheduler", "scheduler-place-push", "watching the scheduler half"),
    (f"{NIXL}.base_scheduler", "NixlBaseConnectorScheduler", "_last_heartbeat_time", "optional",
     "putting a reused scheduler's heartbeat clock back to a fresh one's (without it a case's metadata "
     "carries heartbeats only when the last case's are 5 s old)"),
    (CONN, "NixlPullConnector", "connector_worker", "scheduler-run-pull", "the worker inside the connector"),
    (CONN, "NixlPushConnector", "connector_worker", "scheduler-run-push", "the worker inside the connector"),
]
# (module, class, field, need, what the driver passes) for the request
# metadata the direct path builds (live_case.py pull, push_case.py push).
META = f"{NIXL}.metadata"
FIELDS = []
for _mode in ("pull", "push"):
    FIELDS += [
        (META, "ReqMeta", "local_block_ids", _mode, "decode's blocks to fill"),
        (META, "ReqMeta", "local_physical_block_ids", _mode, "decode's kernel blocks"),
        (META, "ReqMeta", "tp_size", _mode, "prefill's TP size"),
        (META, "ReqMeta", "local_num_computed_blocks", _mode, "decode's prefix hit per group"),
        (META, "ReqMeta", "remote", _mode, "the request's remote side"),
        (META, "RemoteMeta", "block_ids", _mode, "prefill's blocks"),
        (META, "RemoteMeta", "host", _mode, "prefill's side channel"),
        (META, "RemoteMeta", "port", _mode, "prefill's side channel"),
        (META, "RemoteMeta", "engine_id", _mode, "prefill's engine"),
        (META, "RemoteMeta", "request_id", _mode, "prefill's request"),
        (META, "RemoteMeta", "num_tokens", _mode, "the transferred tokens"),
    ]
FIELDS.append((META, "ReqMeta", "awaiting_kvs", "push", "decode waits for prefill's push"))

# (module, callable (a class: its constructor), need, parameters the driver
# relies on, whether their order matters (a positional call or a patched
# method), what the driver does with it). The parameters are looked up
# among a dataclass's init fields, a msgspec struct's fields or the
# signature (`self` left out); a `*args, **kwargs` signature (a subclass
# forwarding to its base) is read from the first base that names them.
SCHED_CLS = "vllm.v1.core.sched.scheduler"
SIGNATURES = [
    ("vllm.v1.outputs", "ModelRunnerOutput", "scheduler-place",
     ("req_ids", "sampled_token_ids", "kv_connector_output"), False,
     "the model runner's output of a step (scheduler_side.py; `req_id_to_index` only where the class has it)"),
    ("vllm.v1.outputs", "KVConnectorOutput", "scheduler-place", ("finished_recving", "finished_sending"), False,
     "finished transfers reported to a scheduler"),
    ("vllm.v1.kv_cache_interface", "KVCacheConfig", "all", ("num_blocks", "kv_cache_tensors", "kv_cache_groups"),
     False, "the KV cache the workers register (live_case.py) and the schedulers' (scheduler_side.py)"),
    ("vllm.v1.kv_cache_interface", "KVCacheTensor", "all", ("size", "layers"), False, "the KV cache tensors"),
    (SCHED_CLS, "Scheduler", "scheduler-place",
     ("vllm_config", "kv_cache_config", "log_stats", "structured_output_manager", "block_size", "hash_block_size"),
     False, "building the engines' schedulers (scheduler_side.py)"),
    (PULL, "NixlConnectorWorker.post_process_device_kv_on_receive", "optional",
     ("block_size_ratio", "block_ids_list", "convert"), True,
     "recording the receive post-process (live_case.watch_post_process replaces it)"),
    (PULL, "NixlConnectorWorker._zero_region_blocks", "optional", ("block_ids",), True,
     "recording the region-mapped zeroing (live_case.watch_post_process replaces it)"),
    # The metadata is passed positionally (its name is free), the TP
    # position by keyword.
    (PULL, "NixlConnectorWorker.add_remote_agent", "pull", ("remote_tp_rank", "remote_tp_size"),
     False, "the handshake, called with remote_tp_rank= and remote_tp_size="),
]


def _parameters(fn):
    """The parameter names `fn` (a class: its constructor) takes, in order,
    `self` left out; None when they cannot be read."""
    import dataclasses

    if inspect.isclass(fn):
        if dataclasses.is_dataclass(fn):
            return [f.name for f in dataclasses.fields(fn) if f.init]
        if hasattr(fn, "__struct_fields__"):
            return list(fn.__struct_fields__)
        for base in inspect.getmro(fn):
            init = base.__dict__.get("__init__")
            if init is None:
                continue
            names = _parameters(init)
            if names is None:
                return None
            if names != ["args", "kwargs"]:
                return names
        return None
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    return [p.name for p in params if p.name != "self"]


def _signature_changes(wanted):
    """`module.name: ...` of every SIGNATURES entry whose parameters no
    longer take what the driver passes (absent names are reported by
    `_absent`)."""
    out = []
    for module_name, dotted, need, params, ordered, purpose in SIGNATURES:
        if not wanted(need):
            continue
        try:
            fn = _lookup(importlib.import_module(module_name), dotted)
        except Exception:
            continue  # an absent module or name is reported as such
        have = _parameters(fn)
        if have is None:
            continue  # nothing readable to compare
        lacking = [p for p in params if p not in have]
        if lacking:
            out.append(f"{module_name}.{dotted}: takes no {', '.join(lacking)} (its parameters: "
                       f"{', '.join(have)}; {purpose})")
        elif ordered and have[: len(params)] != list(params):
            out.append(f"{module_name}.{dotted}: parameters in another order ({', '.join(have)}; the driver "
                       f"relies on {', '.join(params)}: {purpose})")
    return out


def post_process_entry_shape():
    """A missing-piece line when the installed vLLM's receive post-process
    names entries of a shape the driver cannot record (its annotation),
    else None (a known shape, or no annotation to read)."""
    try:
        worker = _lookup(importlib.import_module(PULL), "NixlConnectorWorker")
    except Exception:
        return None
    import compat

    param = compat._post_process_param(worker)
    if param is None or param.annotation is inspect.Parameter.empty:
        return None
    text = param.annotation if isinstance(param.annotation, str) else repr(param.annotation)
    flat = text.replace("typing.", "").replace(" ", "")
    known = ("list[tuple[int,list[int],int]]", "list[tuple[int,list[int],range]]", "list[tuple[list[int],int]]")
    if flat in known:
        return None
    return (f"{PULL}.NixlConnectorWorker.post_process_device_kv_on_receive: block_ids_list is {text}; the driver "
            "records entries (group, blocks, covered) with covered an int or a range, or (blocks, covered)")


# The worker geometry a pull case's v1 trace records (trace_v1.GEOMETRY_ATTRS,
# read with a default: an absent one is recorded as null).
for _name in ("engine_id", "tp_rank", "world_size", "dcp_size", "pcp_size", "pp_size", "use_mla",
              "_has_mamba", "_is_csa_linear", "kv_cache_layout", "block_size", "num_blocks",
              "_logical_num_blocks", "num_regions", "num_descs", "block_len_per_layer",
              "block_stride_per_layer", "region_num_blocks", "region_group_ids", "region_names",
              "region_mem_types", "_region_is_mla", "_transfer_layer_region_indices",
              "_transfer_layer_group_ids", "_ssm_region_indices", "_scratch_region_indices",
              "_ple_group_index", "_mamba_ssm_size", "nixl_memory_type", "use_host_buffer",
              "src_blocks_data"):
    if not any(a[2] == _name for a in ATTRS):
        ATTRS.append((PULL, "NixlConnectorWorker", _name, "optional", "the v1 trace's worker geometry"))


def _lookup(module, dotted):
    obj = module
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


_SOURCES = {}


def _source_of(cls):
    """A class's source text ("" when it has none), read once per process:
    inspect finds a class by parsing its whole module, which for the NIXL
    worker's costs tens of milliseconds a lookup, and the tables look up
    hundreds of names."""
    if cls not in _SOURCES:
        try:
            _SOURCES[cls] = inspect.getsource(cls)
        except (OSError, TypeError):
            _SOURCES[cls] = ""
    return _SOURCES[cls]


def _source_sets(cls, name):
    """Whether `self.<name>` appears in the source of `cls` or a base."""
    pattern = re.compile(rf"\bself\.{re.escape(name)}\b")
    for base in inspect.getmro(cls):
        if base is object:
            continue
        if pattern.search(_source_of(base)):
            return True
    return False


def _has_attr(cls, name):
    return hasattr(cls, name) or _source_sets(cls, name)


def _fields(cls):
    """The names a request-metadata class takes: its dataclass fields, a
    msgspec struct's fields, or else its constructor's parameters."""
    import dataclasses

    if dataclasses.is_dataclass(cls):
        return {f.name for f in dataclasses.fields(cls)}
    if hasattr(cls, "__struct_fields__"):
        return set(cls.__struct_fields__)
    try:
        return set(inspect.signature(cls).parameters)
    except (TypeError, ValueError):
        return set()


def _needed(need, modes):
    return need == "all" or need in modes


def _absent(modes, wanted):
    """(text, need) of every entry whose need is in `wanted` and that the
    installed vLLM lacks; `modes` are the batch's case modes."""
    out = []
    modules = {}

    def module(name):
        if name not in modules:
            try:
                modules[name] = importlib.import_module(name)
            except Exception as e:  # any import failure is a missing module
                modules[name] = e
        return modules[name]

    # A module that does not import is one line, naming what the driver
    # needed from it.
    broken = {}
    for module_name, dotted, need, purpose in REQUIRED:
        if not wanted(need):
            continue
        m = module(module_name)
        if isinstance(m, Exception):
            if module_name not in broken:
                broken[module_name] = []
                out.append(module_name)
            broken[module_name].append(f"{dotted}: {purpose}")
            continue
        try:
            _lookup(m, dotted)
        except AttributeError:
            out.append(f"{module_name}.{dotted} ({purpose})")
    for module_name, cls_name, attr, need, purpose in ATTRS:
        if not wanted(need):
            continue
        m = module(module_name)
        cls = None if isinstance(m, Exception) else getattr(m, cls_name, None)
        if cls is None:
            continue  # the module or the class itself is reported above
        if not _has_attr(cls, attr):
            out.append(f"{module_name}.{cls_name}.{attr} ({purpose})")
    for module_name, cls_name, field, need, purpose in FIELDS:
        if not wanted(need):
            continue
        m = module(module_name)
        cls = None if isinstance(m, Exception) else getattr(m, cls_name, None)
        if cls is None:
            continue  # reported above
        if field not in _fields(cls):
            line = f"{module_name}.{cls_name}.{field} (a field: {purpose})"
            if line not in out:
                out.append(line)
    out += _signature_changes(wanted)
    if wanted("all"):
        shape = post_process_entry_shape()
        if shape is not None:
            out.append(shape)
    for i, item in enumerate(out):
        if item in broken:
            e = modules[item]
            what = "a dependency missing from the venv" if _foreign(e) else "vLLM's own import failed"
            out[i] = (f"{item} (the module does not import: {type(e).__name__}: {e}; {what}; "
                      f"the driver needs from it: {'; '.join(broken[item])})")
    return out


def _foreign(e):
    """Whether an import failure is another package's absence, not vLLM's."""
    name = getattr(e, "name", None) or ""
    return isinstance(e, ModuleNotFoundError) and name != "vllm" and not name.startswith("vllm.")


def nixl_calls(package=NIXL):
    """The NIXL agent methods vLLM's connector calls (`nixl_wrapper.NAME(`
    in the package's sources, read as text), sorted; empty when the package
    is not there."""
    import importlib.util
    import os

    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    names = set()
    for folder in spec.submodule_search_locations:
        for file in sorted(os.listdir(folder)):
            if file.endswith(".py"):
                with open(os.path.join(folder, file), encoding="utf-8") as f:
                    names |= set(re.findall(r"\bnixl_wrapper\.([A-Za-z_]\w*)\(", f.read()))
    return sorted(names)


def unserved_nixl_calls(wrapper_cls, package=NIXL):
    """The NIXL methods vLLM calls that `wrapper_cls` (the driver's stand-in
    or its real-NIXL wrapper) does not implement, as missing-piece lines."""
    return [
        f"{package}: vLLM calls nixl_wrapper.{name}(), which the driver's {wrapper_cls.__name__} "
        "does not implement (the NIXL agent surface of another vLLM)"
        for name in nixl_calls(package)
        if not hasattr(wrapper_cls, name)
    ]


def missing(modes=("pull", "push"), wrapper_cls=None):
    """Every name the installed vLLM lacks that the batch's case `modes`
    need, as `module.name (purpose)` strings, in table order; then every
    NIXL method it calls that `wrapper_cls` (when given) lacks."""
    out = _absent(modes, lambda need: _needed(need, modes))
    if wrapper_cls is not None:
        out += unserved_nixl_calls(wrapper_cls)
    return out


def missing_for_scheduler(modes, phase):
    """What a batch's `requests: "scheduler"` cases of `modes` need in
    `phase` ("place" or "run") that the installed vLLM lacks."""
    if not modes:
        return []
    wanted = {f"scheduler-{phase}"} | {f"scheduler-{phase}-{m}" for m in modes}
    return _absent(modes, lambda need: need in wanted)


def optional():
    """Every optional name the installed vLLM lacks, with what the driver
    does without it."""
    return _absent((), lambda need: need == "optional")
