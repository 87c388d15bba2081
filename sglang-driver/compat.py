"""Which SGLang API the installed release offers, found by feature detection.

The driver drives SGLang's own transfer code unchanged; what differs between
releases is the scaffolding around it, which a scheduler process provides on
a real engine: how a rank's parallel topology is published, how the KV args
are assembled (`_init_kv_manager`), how a sender is made, and how decode
learns that its KV arrived. `detect()` reads those from the installed
modules (names present or absent, signatures), never from a version string;
`PROFILES` lists, one row per release the driver was run on, what detection
gives there (`test_driver.py` checks the row of the installed release).

Per API feature:

- `context`: `publish` (0.5.23: `runtime_context.publish(server_args,
  role=..., ranks=SpawnRanks(...))` and `ParallelContext.override_permanently`)
  or `override` (0.5.16: `get_context().set_server_args(server_args)` and a
  `get_parallel().override(attn_tp_size=..., ...)` held while the rank's
  objects are built or called; the attention-DP globals of
  `sglang.srt.layers.dp_attention` set to size 1 rank 0, as SGLang's own
  `initialize_dp_attention` sets them with DP attention off; the pipeline
  group stated absent by pointing `common.conn.get_pp_group` at `None`, the
  counterpart of 0.5.23's `override_permanently(pp_group=None)`).
- `kv_buffers`: `utils` (`get_kv_transfer_buf_infos(pool)`,
  `build_kv_layer_ids`, `get_pd_kv_layout`, KVArgs `kv_layer_ids`,
  `kv_layout`, `kv_cache_dtype_str`, `rust_http_port`) or `pool`
  (`pool.get_contiguous_buf_infos()`, which 0.5.16's `_init_kv_manager`
  calls, and none of the four newer fields).
- `sender`: `room` (`NixlKVSender(mgr, addr, room)`) or `dest_ranks`
  (0.5.16: `NixlKVSender(mgr, addr, room, dest_tp_ranks, pp_rank)`; the
  driver passes `[rank]` and `0`, as 0.5.16's prefill scheduler passes
  `[self.tp_rank]` and its PP rank).
- `decode_status`: `listener` (0.5.23: prefill sends `KV_STATUS` frames,
  decode's listener thread applies them) or `notifs` (0.5.16: decode's
  `poll()` reads NIXL notifications, `get_new_notifs`, which the stand-in
  delivers after each transfer as NIXL does).
- `device_call`: `manager` (0.5.23: `NixlKVManager.__init__` calls
  `torch.get_device_module(device).set_device(gpu_id)`, recorded) or `none`
  (0.5.16: the manager makes no device call).
"""

import inspect

# One row per release the driver was run on: what detect() gives there.
# (Read in its wheel, not run: 0.5.17 publishes its context as 0.5.23 does
# but has 0.5.16's other features; no row until it is run.)
PROFILES = {
    "0.5.23": {"context": "publish", "kv_buffers": "utils", "sender": "room", "decode_status": "listener",
               "device_call": "manager", "planning": "prepared", "state_args": "utils"},
    "0.5.15.post1": {"context": "functions", "kv_buffers": "pool", "sender": "dest_ranks", "decode_status": "notifs",
                     "device_call": "none", "planning": "prepared", "state_args": "utils"},
    "0.5.16": {"context": "override", "kv_buffers": "pool", "sender": "dest_ranks", "decode_status": "notifs",
               "device_call": "none", "planning": "prepared", "state_args": "utils"},
    "0.5.11": {"context": "functions", "kv_buffers": "pool", "sender": "dest_ranks", "decode_status": "notifs",
               "device_call": "none", "planning": "per_transfer", "state_args": "pool"},
    "0.5.10": {"context": "functions", "kv_buffers": "pool", "sender": "dest_ranks", "decode_status": "notifs",
               "device_call": "none", "planning": "per_transfer", "state_args": "pool"},
}

# The api_check entries (dotted names, or "Class.attr" for ATTRS, "KVArgs.x")
# a profile feature does not use, and the ones it uses instead.
NOT_USED = {
    ("context", "override"): {
        "publish", "SpawnRanks", "ParallelContext.override_permanently", "get_model", "get_disagg", "get_device",
    },
    ("kv_buffers", "pool"): {
        "get_kv_transfer_buf_infos", "build_kv_layer_ids", "get_pd_kv_layout",
        "KVArgs.kv_layer_ids", "KVArgs.kv_layout", "KVArgs.kv_cache_dtype_str", "KVArgs.rust_http_port",
    },
    ("decode_status", "notifs"): {
        "NixlKVManager._start_decode_listener_thread", "CommonKVManager._send_multipart_locked",
        "NixlKVManager.build_receiver_registration_message", "NixlKVManager.build_receiver_metadata_message",
        "NixlKVManager._prep_xfer_dlist", "NixlKVManager._post_xfer", "NixlKVManager._heartbeat_shutdown",
        "NixlKVManager._socket_send_locks",
    },
    ("device_call", "none"): {"NixlKVManager.__init__:torch.get_device_module"},
    ("context", "functions"): {
        "publish", "SpawnRanks", "ParallelContext.override_permanently", "get_model", "get_disagg", "get_device",
        "reset_context", "get_parallel",
    },
    ("planning", "per_transfer"): {
        "NixlKVManager._prepare_payload_xfer", "NixlKVManager._init_equal_tp_prep_handle",
        "NixlKVManager._init_hetero_tp_prep_handle", "NixlKVManager.transfer_worker", "NixlKVManager.transfer_queues",
    },
    # Before setup_state_kv_args (0.5.10) KVArgs had no prefill_end_layer either.
    ("state_args", "pool"): {"setup_state_kv_args", "KVArgs.prefill_end_layer"},
}
RC = "sglang.srt.runtime_context"
POOL = "sglang.srt.mem_cache.memory_pool"
NIXL = "sglang.srt.disaggregation.nixl.conn"
COMMON = "sglang.srt.disaggregation.common.conn"
INSTEAD = {
    ("context", "override"): [
        (RC, "get_context", "publishing each rank's server args (set_server_args)"),
        (RC, "ParallelContext.override", "each rank's attention TP while its objects are built or called"),
        ("sglang.srt.layers.dp_attention", "get_attention_dp_size", "the attention-DP size (set to 1)"),
        (COMMON, "get_pp_group", "replaced: the absent pipeline group"),
    ],
    ("context", "functions"): [
        (COMMON, "get_attention_tp_size", "replaced: each rank's attention TP size"),
        (COMMON, "get_attention_tp_rank", "replaced: each rank's attention TP rank"),
        (COMMON, "get_pp_group", "replaced: the absent pipeline group"),
    ],
    ("kv_buffers", "pool"): [
        (POOL, "MHATokenToKVPool.get_contiguous_buf_infos", "the KV regions of a pool (as _init_kv_manager)"),
    ],
    ("decode_status", "notifs"): [
        (NIXL, "NixlKVManager.update_transfer_status", "decode's read of NIXL notifications"),
        (NIXL, "NixlKVManager.check_transfer_done", "decode's completion check"),
    ],
}


def detect(rc, disagg_utils, nixl_conn):
    """The profile of the installed SGLang, from its modules (rc: its
    runtime_context module, None where the release has none)."""
    return {
        # 0.5.14-0.5.15.post1 ship a runtime context, but their connection
        # module still reads the topology through dp_attention's functions.
        "context": "functions" if rc is None or hasattr(inspect.getmodule(nixl_conn.NixlKVManager.__mro__[1]),
                                                           "get_attention_tp_size")
        else "publish" if hasattr(rc, "publish") else "override",
        "kv_buffers": "utils" if hasattr(disagg_utils, "get_kv_transfer_buf_infos") else "pool",
        "sender": "dest_ranks" if "dest_tp_ranks" in inspect.signature(nixl_conn.NixlKVSender.__init__).parameters
        else "room",
        "decode_status": "listener" if hasattr(nixl_conn.NixlKVManager, "_start_decode_listener_thread")
        else "notifs",
        "device_call": "manager" if "torch.get_device_module" in inspect.getsource(nixl_conn.NixlKVManager.__init__)
        else "none",
        "planning": "prepared" if hasattr(nixl_conn.NixlKVManager, "_prepare_payload_xfer") else "per_transfer",
        "state_args": "utils" if hasattr(disagg_utils, "setup_state_kv_args") else "pool",
    }


def detect_installed():
    """detect() on the importable SGLang (imports its modules)."""
    import importlib

    try:
        rc = importlib.import_module(RC)
    except ImportError:
        rc = None
    return detect(rc, importlib.import_module("sglang.srt.disaggregation.utils"),
                  importlib.import_module(NIXL))


def not_used(profile):
    out = set()
    for key, names in NOT_USED.items():
        if profile.get(key[0]) == key[1]:
            out |= names
    return out


def instead(profile):
    out = []
    for key, entries in INSTEAD.items():
        if profile.get(key[0]) == key[1]:
            out.extend(entries)
    return out


class Context:
    """Publishes one rank's runtime context for the detected profile."""

    def __init__(self, S):
        self.S = S
        self.profile = S["profile"]

    TOPOLOGY_NAMES = ("get_attention_tp_size", "get_attention_tp_rank", "get_attention_cp_size",
                      "get_attention_cp_rank", "get_attention_dp_size", "get_attention_dp_rank", "get_pp_group")

    def attn_tp_size(self):
        if self.profile["context"] == "functions":
            return self.topo["attn_tp_size"]
        return self.S["runtime_context"].get_parallel().attn_tp_size

    def setup_process(self):
        """Once per process: what the scheduler of 0.5.16 (or of a release
        before 0.5.14) would have initialised."""
        self.topo = {}
        if self.profile["context"] == "functions":
            # No runtime context: SGLang's connection modules read the
            # topology through dp_attention's / parallel_state's functions,
            # imported by name; those names (only) answer the published rank.
            topo = self.topo
            answers = {
                "get_attention_tp_size": lambda: topo["attn_tp_size"],
                "get_attention_tp_rank": lambda: topo["attn_tp_rank"],
                "get_attention_cp_size": lambda: 1,
                "get_attention_cp_rank": lambda: 0,
                "get_attention_dp_size": lambda: 1,
                "get_attention_dp_rank": lambda: 0,
                "get_pp_group": lambda: None,
            }
            for mod in (self.S["common_conn"], self.S["nixl_conn"]):
                for name in self.TOPOLOGY_NAMES:
                    if hasattr(mod, name):
                        setattr(mod, name, answers[name])
            return
        if self.profile["context"] != "override":
            return
        from sglang.srt.layers import dp_attention

        dp_attention._ATTN_DP_SIZE = 1
        dp_attention._ATTN_DP_RANK = 0
        if hasattr(dp_attention, "_ATTN_DP_RANK_LOCAL"):
            dp_attention._ATTN_DP_RANK_LOCAL = 0
        self.S["common_conn"].get_pp_group = lambda: None

    def enter(self, server_args, rank):
        """Publish; returns what exit() needs."""
        if self.profile["context"] == "functions":
            self.topo.update(attn_tp_size=server_args.tp_size, attn_tp_rank=rank)
            return None
        rc = self.S["runtime_context"]
        rc.reset_context()
        if self.profile["context"] == "publish":
            rc.publish(server_args, role="scheduler", ranks=rc.SpawnRanks(world_rank=rank, dp_rank=None,
                                                                          gpu_id=rank))
            rc.get_parallel().override_permanently(pp_group=None)
            return None
        rc.get_context().set_server_args(server_args)
        tp = server_args.tp_size
        cm = rc.get_parallel().override(
            world_size=tp, world_rank=rank, tp_size=tp, tp_rank=rank, pp_size=1, pp_rank=0,
            attn_tp_size=tp, attn_tp_rank=rank, attn_cp_size=1, attn_cp_rank=0,
            attn_dp_size=1, attn_dp_rank=0, pp_group=None,
        )
        cm.__enter__()
        return cm

    @staticmethod
    def exit(token):
        if token is not None:
            token.__exit__(None, None, None)


def kv_args(S, role, rank, pool, meta, model, tp_size):
    """The KV args of the release's `_init_kv_manager` for a pool without
    draft model, hisparse, staging, PP or state, under the published
    context. 0.5.23: case.mirror_init_kv_manager; 0.5.16: this."""
    du = S["disagg_utils"]
    ka = S["base_conn"].KVArgs()
    ka.engine_rank = rank if role == "prefill" else rank % tp_size
    ka.pp_rank = 0
    ka.system_dp_rank = 0
    if role == "prefill":
        ka.prefill_start_layer = pool.start_layer
        if S["profile"]["state_args"] == "utils":
            ka.mla_compression_ratios = None
    ptrs, lens, item_lens = pool.get_contiguous_buf_infos()
    if role == "prefill" and S["profile"]["state_args"] == "utils":
        ka.prefill_end_layer = getattr(pool, "end_layer", None)
    ka.kv_data_ptrs = ptrs
    ka.kv_data_lens = lens
    ka.kv_item_lens = item_lens
    if role == "decode":
        ka.kv_data_mem_kinds = ["VRAM"] * len(ptrs)
    if role == "prefill" and model["attention"] != "mla":
        ka.kv_head_num = pool.head_num
        ka.total_kv_head_num = model["total_kv_heads"]
    ka.page_size = pool.page_size
    ka.aux_data_ptrs, ka.aux_data_lens, ka.aux_item_lens = meta.get_buf_infos()
    ka.ib_device = None
    ka.gpu_id = rank
    if S["profile"]["state_args"] == "utils":
        du.setup_state_kv_args(ka, pool, None, model["layers"], req_to_token_pool=None)
    else:
        # Before setup_state_kv_args (0.5.10's _init_kv_manager): the pool's
        # own state buffers, none for these pools; the state type "none".
        ka.state_data_ptrs, ka.state_data_lens, ka.state_item_lens = (
            pool.get_state_buf_infos() if hasattr(pool, "get_state_buf_infos") else ([], [], []))
        ka.state_type = "none"
        ka.state_dim_per_tensor = []
    return ka


def metadata_buffers(S, slots, dtype):
    """SGLang's MetadataBuffers (the aux rows); `max_sampling_mask_tokens`
    where the release has it (0.5.16+), else its defaults."""
    cls = S["disagg_utils"].MetadataBuffers
    kwargs = dict(size=slots, hidden_size=16, hidden_states_dtype=dtype)
    if "max_sampling_mask_tokens" in inspect.signature(cls.__init__).parameters:
        kwargs["max_sampling_mask_tokens"] = 0
    return cls(**kwargs)


def make_sender(S, mgr, bootstrap_addr, room, rank):
    cls = S["nixl_conn"].NixlKVSender
    if S["profile"]["sender"] == "room":
        return cls(mgr, bootstrap_addr, room)
    return cls(mgr, bootstrap_addr, room, [rank], 0)
