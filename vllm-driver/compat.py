"""What differs between the vLLM releases the driver drives.

Every difference is found by testing the installed vLLM for the feature
(`hasattr`, a signature, the shape of a value vLLM passes), never by its
version number, so that a branch or a release nobody has seen yet gets the
path its code actually has. The case modules call these few functions where
a release differs; `profile()` says, for the start-up line and the README's
table, which path each feature took.

Features (README.md, "Releases the driver drives"):

- `nixl_version_check`: the base worker's `check_nixl_version` (0.33.0),
  switched off for the stand-in; absent before, nothing to switch off.
- pinned staging memory: `vllm.utils.torch_utils.PIN_MEMORY`, a module
  global computed once (0.30.0, 0.31.0, 0.33.0) or resolved at each use
  through `is_pin_memory_available()` (0.32.0); both names are answered
  "no" (host tensors on a CPU-only machine).
- prepared lists: strided rows handed to `prep_xfer_dlist` (0.33.0), or
  plain `(addr, len, dev)` rows built by `get_xfer_descs` first (0.32.0 and
  before); the stand-in serves both, the real-NIXL wrapper only the first.
- a failed receive: `get_transfer_results()` reports it in
  `failed_recving` (every release seen), `get_finished()` among the
  finished ones (`received`).
- the receive post-process's entries: `(group, kernel blocks, covered
  sub-blocks)` (0.32.0 and later) or `(kernel blocks, covered sub-blocks)`
  without the group (0.31.0 and before); the driver records the first form,
  putting in the attention group for the second. The covered sub-blocks
  are a count `N` (sub-blocks `0..N`; 0.33.0 and before) or a `range`
  (0.34.0, whose pairing from the last token can leave the head of the
  list uncovered); the driver records a count as it is and a range as
  `[start, stop]` (`covered_value`).
"""

import dataclasses
import inspect

def nixl_version_check(base_worker):
    """vLLM's NIXL version check in the base worker module, or None where
    this vLLM has none."""
    return getattr(base_worker, "check_nixl_version", None)


def set_nixl_version_check(base_worker, check):
    """Installs `check` as the base worker's NIXL version check, only where
    this vLLM has one (there is nothing to switch off otherwise)."""
    if hasattr(base_worker, "check_nixl_version"):
        base_worker.check_nixl_version = check


def pin_memory_off(_torch_utils):
    """Switches pinned staging memory off in every form this vLLM asks for
    it; returns the forms it found ("PIN_MEMORY", "is_pin_memory_available()")."""
    found = []
    if hasattr(_torch_utils, "PIN_MEMORY"):
        _torch_utils.PIN_MEMORY = False
        found.append("PIN_MEMORY")
    if hasattr(_torch_utils, "is_pin_memory_available"):
        _torch_utils.is_pin_memory_available = lambda: False
        found.append("is_pin_memory_available()")
    return found


def list_style():
    """"plain" when vLLM builds its lists with `get_xfer_descs` before
    preparing them, else "strided" (rows handed to `prep_xfer_dlist`)."""
    import api_check

    return "plain" if "get_xfer_descs" in api_check.nixl_calls() else "strided"


def _post_process_param(worker_cls):
    try:
        return inspect.signature(worker_cls.post_process_device_kv_on_receive).parameters.get("block_ids_list")
    except (AttributeError, TypeError, ValueError):
        return None


def post_process_entries_have_group(worker_cls):
    """Whether this vLLM's receive post-process takes `(group, blocks,
    covered)` entries; read from its annotation (None when it has none)."""
    param = _post_process_param(worker_cls)
    if param is None or param.annotation is inspect.Parameter.empty:
        return None
    text = param.annotation if isinstance(param.annotation, str) else repr(param.annotation)
    text = text.replace("typing.", "").replace(" ", "")
    return "tuple[int,list[int],int]" in text or "tuple[int,list[int],range]" in text


def post_process_covered_type(worker_cls):
    """"range" or "int": the type this vLLM's receive post-process names for
    an entry's covered sub-blocks (its annotation), or None when it names
    none."""
    param = _post_process_param(worker_cls)
    if param is None or param.annotation is inspect.Parameter.empty:
        return None
    text = param.annotation if isinstance(param.annotation, str) else repr(param.annotation)
    text = text.replace("typing.", "").replace(" ", "")
    for kind in ("range", "int"):
        if text.endswith(f",{kind}]]"):
            return kind
    return None


def covered_value(covered):
    """An entry's covered sub-blocks as the driver records them: a count
    as it is, a `range` as `[start, stop]` (step 1 only)."""
    if isinstance(covered, range):
        if covered.step != 1:
            raise CoveredUnknown(f"covered sub-blocks {covered!r}: a step other than 1")
        return [covered.start, covered.stop]
    if isinstance(covered, bool) or not isinstance(covered, int):
        raise CoveredUnknown(f"covered sub-blocks of type {type(covered).__name__}: {covered!r}")
    return covered


def _attention_groups(worker):
    """Indices of the worker's transfer groups that are not mamba state."""
    types = getattr(worker, "_group_spec_types", None)
    if types is None:
        return None
    from vllm.v1 import kv_cache_interface as kvi

    mamba = getattr(kvi, "MambaSpec", None)
    return [g for g, t in enumerate(types) if not (mamba is not None and isinstance(t, type) and issubclass(t, mamba))]


class EntryUnknown(Exception):
    """A post-process entry whose attention group the driver cannot tell."""


class CoveredUnknown(EntryUnknown):
    """Covered sub-blocks of a post-process entry the driver cannot read."""


def post_process_entry(worker, entry):
    """One entry of a receive post-process call as `(group, blocks,
    covered)`. An entry without its group (`(blocks, covered)`) is given the
    worker's one attention group; with several the group is ambiguous and
    this raises EntryUnknown (never a guess)."""
    if len(entry) == 3:
        group, blocks, covered = entry
        return (group, blocks, covered_value(covered))
    if len(entry) != 2:
        raise EntryUnknown(f"a post-process entry of {len(entry)} fields: {entry!r}")
    groups = _attention_groups(worker)
    if groups is None or len(groups) != 1:
        raise EntryUnknown(
            "this vLLM's receive post-process names no group in its entries, and the worker has "
            f"{'no group types' if groups is None else f'{len(groups)} attention groups'}"
        )
    blocks, covered = entry
    return (groups[0], blocks, covered_value(covered))


def init_fields(cls):
    """The keyword names `cls(...)` accepts: a dataclass's init fields,
    else its constructor's parameters."""
    if dataclasses.is_dataclass(cls):
        return {f.name for f in dataclasses.fields(cls) if f.init}
    try:
        return set(inspect.signature(cls).parameters)
    except (TypeError, ValueError):
        return set()


def model_runner_output(cls, req_ids, **fields):
    """`cls(req_ids=..., **fields)` (vLLM's `ModelRunnerOutput`), with
    `req_id_to_index` added where this vLLM's class still has the field
    (0.33.0 and before; 0.34.0 dropped it)."""
    if "req_id_to_index" in init_fields(cls):
        fields["req_id_to_index"] = {r: i for i, r in enumerate(req_ids)}
    return cls(req_ids=req_ids, **fields)


def resolved_block_sizes(kv_cache_config, config, scheduler_block, hash_block):
    """Writes into the scheduler's `kv_cache_config` the block sizes the
    engine core resolves into it where this vLLM's KVCacheConfig has the
    fields (0.34.0: `hash_block_size`, which the connector's scheduler
    half asserts; `cache_hit_alignment_tokens`); returns the fields set."""
    if dataclasses.is_dataclass(kv_cache_config):
        fields = {f.name for f in dataclasses.fields(kv_cache_config)}
    else:
        fields = set(vars(kv_cache_config))
    written = []
    if "hash_block_size" in fields:
        kv_cache_config.hash_block_size = hash_block
        written.append("hash_block_size")
    if "cache_hit_alignment_tokens" in fields:
        from vllm.v1.core import kv_cache_utils

        resolve = getattr(kv_cache_utils, "resolve_cache_hit_alignment_tokens", None)
        if resolve is not None:
            kv_cache_config.cache_hit_alignment_tokens = resolve(kv_cache_config, config, scheduler_block, hash_block)
            written.append("cache_hit_alignment_tokens")
    return written


def received(worker):
    """`(finished, failed)` request ids of one completion poll of a pull
    worker. `get_transfer_results` reports a failed receive apart
    (`failed_recving`); the older `get_finished` counts it among the
    finished ones, and is used only where the worker lacks the first."""
    results = getattr(worker, "get_transfer_results", None)
    if results is None:
        return set(worker.get_finished()[1]), set()
    out = results()
    return set(out.finished_recving), set(getattr(out, "failed_recving", ()) or ())


def profile():
    """`(feature, what the installed vLLM has)` pairs, in README order."""
    import vllm.utils.torch_utils as torch_utils
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl import base_worker
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.worker import NixlConnectorWorker

    have_group = post_process_entries_have_group(NixlConnectorWorker)
    return [
        ("check_nixl_version", "present" if nixl_version_check(base_worker) is not None else "absent"),
        (
            "pinned memory",
            " and ".join(n for n in ("PIN_MEMORY", "is_pin_memory_available") if hasattr(torch_utils, n)) or "none",
        ),
        ("lists", list_style()),
        (
            "post-process entries",
            "unknown" if have_group is None else ("(group, blocks, covered)" if have_group else "(blocks, covered)"),
        ),
        ("covered sub-blocks", post_process_covered_type(NixlConnectorWorker) or "unknown"),
    ]


def describe():
    """The profile as one line."""
    return "; ".join(f"{k}: {v}" for k, v in profile())
