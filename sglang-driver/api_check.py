"""What the driver needs from the SGLang it runs, checked before any case.

Another SGLang (a newer release, a branch) may have moved, renamed or
dropped what the driver builds, calls, patches or names in its records.
`missing()` imports each module and looks each name up without running
anything, and returns every absent one with what the driver uses it for, so
that all of them are named at once instead of failing on the first.

Entries:

- `REQUIRED`: modules, classes, functions, methods and module globals,
  looked up by dotted name.
- `ATTRS`: attributes of SGLang objects the driver reads or sets (most are
  set in `__init__`), found on the class or as `self.<name>` / a class
  annotation in the source of the class or a base; nothing is built.
- `SOURCES`: behaviour the driver relies on that has no name of its own,
  checked as text in the function's source (e.g. that the local IP
  detection honours `SGLANG_HOST_IP`).
- the NIXL agent methods SGLang's NIXL connection module calls
  (`self.agent.NAME(` in its source) and the names it imports from
  `nixl._api` / `nixl._bindings`, which the stand-in must serve.

`python api_check.py` prints the missing pieces and exits 2 when there are
any, else prints what it checked and exits 0.
"""

import ast
import importlib
import importlib.util
import inspect
import re
import sys

NIXL = "sglang.srt.disaggregation.nixl.conn"
COMMON = "sglang.srt.disaggregation.common.conn"
BASE = "sglang.srt.disaggregation.base.conn"
UTILS = "sglang.srt.disaggregation.utils"
POOL = "sglang.srt.mem_cache.memory_pool"
RC = "sglang.srt.runtime_context"

# (module, dotted name, what the driver uses it for)
REQUIRED = [
    (NIXL, "NixlKVManager", "the KV manager of every rank"),
    (NIXL, "NixlKVSender", "prefill's sender of the request"),
    (NIXL, "NixlKVReceiver", "decode's receiver of the request"),
    (NIXL, "KVArgsRegisterInfo.from_zmq", "prefill's parser of decode's registration (run by SGLang's bootstrap thread)"),
    (NIXL, "TransferInfo.from_zmq", "prefill's parser of decode's per-request metadata"),
    (NIXL, "NixlKVManager._start_bootstrap_thread", "prefill's bootstrap thread, fed in process"),
    (NIXL, "NixlKVManager._start_decode_listener_thread", "decode's listener thread, fed in process"),
    (NIXL, "NixlKVManager._add_remote_peer", "the peer setup the records attribute lists to"),
    (NIXL, "NixlKVManager._prepare_payload_xfer", "the descriptor preparation the records attribute lists to"),
    (NIXL, "NixlKVManager._init_equal_tp_prep_handle", "equal-TP / MLA descriptor lists"),
    (NIXL, "NixlKVManager._init_hetero_tp_prep_handle", "heterogeneous-TP (head slice) descriptor lists"),
    (NIXL, "NixlKVManager._prep_xfer_dlist", "the maker of every prepared list"),
    (NIXL, "NixlKVManager.transfer_worker", "the thread every transfer must be posted from"),
    (NIXL, "NixlKVManager._post_xfer", "the poster of every transfer"),
    (NIXL, "NixlKVManager.send_kvcache", "the whole-page send path"),
    (NIXL, "NixlKVManager.send_kvcache_slice", "the head-slice send path"),
    (NIXL, "NixlKVManager.send_aux", "the aux rows' send path"),
    (NIXL, "NixlKVManager.add_transfer_request", "queueing a chunk to a transfer worker (called by the sender)"),
    (NIXL, "NixlKVManager.build_receiver_registration_message", "decode's registration frames"),
    (NIXL, "NixlKVManager.build_receiver_metadata_message", "decode's per-request frames"),
    (COMMON, "get_zmq_socket_on_host", "replaced: each manager's PULL socket, in process"),
    (COMMON, "requests", "replaced: the bootstrap server's HTTP, answered in process"),
    (COMMON, "CommonKVManager._connect", "replaced: prefill's PUSH sockets to decode, in process"),
    (COMMON, "CommonKVReceiver._connect", "replaced: decode's PUSH sockets to prefill, in process"),
    (COMMON, "CommonKVManager._send_multipart_locked", "prefill's status messages (through _connect)"),
    (COMMON, "CommonKVManager.register_to_bootstrap", "prefill's bootstrap row (answered by the in-process table)"),
    (COMMON, "CommonKVManager.try_ensure_parallel_info", "decode's read of the prefill's topology and rank mapping"),
    (COMMON, "CommonKVManager._resolve_rank_mapping", "the rank mapping recorded per decode rank"),
    (COMMON, "CommonKVSender.init", "telling the sender the request's page count and aux row"),
    (COMMON, "CommonKVSender.send", "sending the request's pages"),
    (COMMON, "CommonKVSender.poll", "prefill's room status"),
    (COMMON, "CommonKVReceiver.init", "decode's bootstrap and registration"),
    (COMMON, "CommonKVReceiver.send_metadata", "decode's request pages"),
    (COMMON, "CommonKVReceiver.poll", "decode's room status"),
    (COMMON, "PrefillServerInfo", "the rank mapping recorded per decode rank"),
    (BASE, "KVArgs", "the KV args of each rank"),
    (BASE, "KVPoll", "room statuses"),
    (UTILS, "DisaggregationMode", "prefill and decode managers"),
    (UTILS, "MetadataBuffers", "the aux rows of each rank"),
    (UTILS, "get_kv_transfer_buf_infos", "the KV regions of a pool (as _init_kv_manager)"),
    (UTILS, "build_kv_layer_ids", "the KV layer ids (as _init_kv_manager)"),
    (UTILS, "get_pd_kv_layout", "the KV layout tag (as _init_kv_manager)"),
    (UTILS, "setup_state_kv_args", "the state components (as _init_kv_manager)"),
    (POOL, "MHATokenToKVPool", "MHA/GQA pools"),
    (POOL, "MLATokenToKVPool", "MLA pools"),
    (RC, "publish", "publishing each rank's runtime context"),
    (RC, "reset_context", "clearing the runtime context between ranks and cases"),
    (RC, "SpawnRanks", "each rank's world rank and GPU id"),
    (RC, "get_parallel", "the rank's attention TP, and stating the absent PP group"),
    (RC, "ParallelContext.override_permanently", "stating pp_group = None (no torch.distributed groups)"),
    (RC, "get_model", "the KV cache dtype string (as _init_kv_manager)"),
    (RC, "get_disagg", "the IB device (as _init_kv_manager)"),
    (RC, "get_device", "the GPU id (as _init_kv_manager)"),
    ("sglang.srt.server_args", "ServerArgs", "each engine's server args"),
]

# (module, class, attribute, what the driver does with it)
ATTRS = [
    (NIXL, "NixlKVManager", "agent", "the rank's NIXL agent (its name in the records)"),
    (NIXL, "NixlKVManager", "rank_port", "routing frames to the rank's in-process socket"),
    (NIXL, "NixlKVManager", "bootstrap_port", "the bootstrap address decode uses"),
    (NIXL, "NixlKVManager", "failure_records", "why a room failed"),
    (NIXL, "NixlKVManager", "transfer_queues", "ending the transfer workers at case end"),
    (NIXL, "NixlKVManager", "prefill_info_table", "the rank mapping decode computed"),
    (NIXL, "NixlKVManager", "_heartbeat_shutdown", "ending decode's heartbeat thread at case end"),
    (NIXL, "NixlKVManager", "_socket_send_locks", "set by the replacement of _connect, as SGLang's does"),
    (COMMON, "PrefillServerInfo", "target_tp_rank", "the rank mapping record"),
    (COMMON, "PrefillServerInfo", "target_tp_ranks", "the rank mapping record"),
    (COMMON, "PrefillServerInfo", "required_dst_info_num", "the rank mapping record"),
    (COMMON, "PrefillServerInfo", "required_prefill_response_num", "the rank mapping record"),
    (POOL, "MHATokenToKVPool", "k_buffer", "the K regions' bytes"),
    (POOL, "MHATokenToKVPool", "v_buffer", "the V regions' bytes"),
    (POOL, "MHATokenToKVPool", "head_num", "heads per rank"),
    (POOL, "MLATokenToKVPool", "kv_buffer", "the MLA regions' bytes"),
    (POOL, "MHATokenToKVPool", "start_layer", "the prefill start layer (as _init_kv_manager)"),
]
# Every KVArgs field the driver sets (mirror_init_kv_manager in case.py).
for _name in ("engine_rank", "pp_rank", "system_dp_rank", "rust_http_port", "kv_cache_dtype_str", "kv_layout",
              "prefill_start_layer", "prefill_end_layer", "kv_data_ptrs", "kv_data_lens", "kv_item_lens",
              "kv_layer_ids", "kv_head_num", "total_kv_head_num", "page_size", "aux_data_ptrs", "aux_data_lens",
              "aux_item_lens", "ib_device", "gpu_id"):
    ATTRS.append((BASE, "KVArgs", _name, "a KV args field the driver sets as _init_kv_manager does"))

# (module, function, text, what the driver relies on)
SOURCES = [
    ("sglang.srt.utils.network", "get_local_ip_auto", "SGLANG_HOST_IP",
     "forcing every address SGLang advertises to 127.0.0.1 (SGLANG_HOST_IP)"),
    (NIXL, "NixlKVManager.__init__", "from nixl._api import",
     "NIXL is imported when the manager is built, after the stand-in is in sys.modules"),
    (NIXL, "NixlKVManager.__init__", "torch.get_device_module",
     "the only device call of the manager's build (torch.cuda.set_device, recorded)"),
]


def _lookup(module, dotted):
    obj = module
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def _has_attr(cls, name):
    if hasattr(cls, name):
        return True
    pattern = re.compile(rf"\bself\.{re.escape(name)}\b")
    for base in inspect.getmro(cls):
        if base is object:
            continue
        if name in getattr(base, "__annotations__", {}):
            return True
        try:
            source = inspect.getsource(base)
        except (OSError, TypeError):
            continue
        if pattern.search(source):
            return True
    return False


def _foreign(e):
    name = getattr(e, "name", None) or ""
    return isinstance(e, ModuleNotFoundError) and name != "sglang" and not name.startswith("sglang.")


def nixl_surface(module_name=NIXL):
    """(agent methods SGLang calls, names it imports from nixl._api and
    nixl._bindings), read from its source."""
    spec = importlib.util.find_spec(module_name)
    if spec is None or spec.origin is None:
        return [], []
    with open(spec.origin, encoding="utf-8") as f:
        text = f.read()
    calls = sorted(set(re.findall(r"\bself\.agent\.([A-Za-z_]\w*)\(", text)))
    imported = {
        alias.name
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.ImportFrom) and node.module in ("nixl._api", "nixl._bindings")
        for alias in node.names
    }
    return calls, sorted(imported)


def missing(stand_in=None):
    """Every piece the installed SGLang lacks, as `what (purpose)` lines."""
    out = []
    modules = {}
    broken = {}

    def module(name):
        if name not in modules:
            try:
                modules[name] = importlib.import_module(name)
            except Exception as e:
                modules[name] = e
        return modules[name]

    def need_module(name, what):
        m = module(name)
        if isinstance(m, Exception):
            if name not in broken:
                broken[name] = []
                out.append(name)
            broken[name].append(what)
            return None
        return m

    # The release's API profile (compat.py): the names a profile feature does
    # not use are not required; the ones it uses instead are.
    import compat

    try:
        profile = compat.detect_installed()
    except Exception:
        profile = {}
    skip = compat.not_used(profile)
    required = [e for e in REQUIRED if e[1] not in skip] + compat.instead(profile)
    attrs = [e for e in ATTRS if f"{e[1]}.{e[2]}" not in skip]
    for module_name, dotted, purpose in required:
        m = need_module(module_name, f"{dotted}: {purpose}")
        if m is None:
            continue
        try:
            _lookup(m, dotted)
        except AttributeError:
            out.append(f"{module_name}.{dotted} ({purpose})")
    for module_name, cls_name, attr, purpose in attrs:
        m = module(module_name)
        cls = None if isinstance(m, Exception) else getattr(m, cls_name, None)
        if cls is None:
            continue  # reported above
        if not _has_attr(cls, attr):
            out.append(f"{module_name}.{cls_name}.{attr} ({purpose})")
    for module_name, dotted, text, purpose in [e for e in SOURCES if f"{e[1]}:{e[2]}" not in skip]:
        m = need_module(module_name, f"{dotted}: {purpose}")
        if m is None:
            continue
        try:
            source = inspect.getsource(_lookup(m, dotted))
        except (AttributeError, OSError, TypeError):
            out.append(f"{module_name}.{dotted} ({purpose})")
            continue
        if text not in source:
            out.append(f"{module_name}.{dotted} no longer contains {text!r} ({purpose})")
    if stand_in is not None:
        calls, imported = nixl_surface()
        for name in calls:
            if not hasattr(stand_in.nixl_agent, name):
                out.append(f"{NIXL}: SGLang calls self.agent.{name}(), which the driver's NIXL stand-in does not "
                           "implement (the NIXL agent surface of another SGLang)")
        for name in imported:
            if not hasattr(stand_in, name):
                out.append(f"{NIXL}: SGLang imports {name} from NIXL, which the driver's NIXL stand-in does not "
                           "provide")
    for i, item in enumerate(out):
        if item in broken:
            e = modules[item]
            what = "a dependency missing from the venv" if _foreign(e) else "SGLang's own import failed"
            out[i] = (f"{item} (the module does not import: {type(e).__name__}: {e}; {what}; "
                      f"the driver needs from it: {'; '.join(broken[item])})")
    return out


def counts():
    return len(REQUIRED) + len(ATTRS) + len(SOURCES)


def version():
    try:
        import importlib.metadata as md

        sg = md.version("sglang")
    except Exception:
        sg = "unknown"
    try:
        import torch

        tv = torch.__version__
    except Exception:
        tv = "unknown"
    return sg, tv


def main():
    import fake_nixl

    saved = fake_nixl.install()  # SGLang's connection module imports NIXL's error classes at import
    try:
        gone = missing(stand_in=fake_nixl)
    finally:
        fake_nixl.uninstall(saved)
    sg, tv = version()
    if gone:
        print(f"api_check: this SGLang ({sg} (torch {tv})) lacks what the driver needs:", file=sys.stderr)
        for line in gone:
            print(f"  - {line}", file=sys.stderr)
        return 2
    calls, imported = nixl_surface()
    print(f"api_check: SGLang {sg} (torch {tv}): all {counts()} names the driver relies on are present; "
          f"the stand-in serves the {len(calls)} NIXL agent methods and {len(imported)} NIXL names SGLang uses")
    return 0


if __name__ == "__main__":
    import os
    import warnings

    warnings.filterwarnings("ignore")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.exit(main())
