"""One kvgeom case on vLLM's real NIXL connector workers (pull mode).

Real: vLLM's VllmConfig, KV-cache specs and config, NixlConnectorWorker
(registration, add_remote_agent, _read_blocks_for_req, get_finished with the
receive post-process). A case with `requests: "scheduler"` instead gets the
connector metadata vLLM's scheduler built (place_case.py), bound to vLLM's
connector as the model runner binds it (`_scheduler_requests`). Faked: NIXL (fake_nixl; with `use_nixl("real")` real
NIXL agents over host memory instead, real_nixl), the platform, the
attention backend and the TP group.
"""

import atexit
import contextlib
import ctypes
import json
import os
import re
import shutil
import tempfile
import time
import traceback

# vLLM's NIXL worker moves mamba conv state only in the DS layout (dim,
# state_len), whose sub-projections are contiguous; kvgeom's geometry is laid
# out that way.
os.environ["VLLM_SSM_CONV_STATE_LAYOUT"] = "DS"

import torch  # noqa: E402

import vllm
from vllm.distributed.kv_transfer.kv_connector.v1.nixl import base_worker
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.worker import NixlConnectorWorker
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.metadata import (
    NixlAgentMetadata,
    RemoteMeta,
    ReqMeta,
)
from vllm.v1 import kv_cache_interface as kvi
from vllm.v1.kv_cache_layout import KVCacheLayout
from vllm.v1.worker.utils import allocate_kv_cache

import compat
import compat_hash
import failure
import fake_nixl
import real_nixl
import trace_v1

VLLM_VERSION = vllm.__version__

# An OPT-125m style model config: VllmConfig needs a ModelConfig; the
# geometry itself comes from the KV-cache specs built below.
OPT_CONFIG = {
    "architectures": ["OPTForCausalLM"],
    "model_type": "opt",
    "hidden_size": 4096,
    "num_attention_heads": 64,
    "num_hidden_layers": 12,
    "ffn_dim": 3072,
    "max_position_embeddings": 2048,
    "vocab_size": 50272,
    "word_embed_proj_dim": 4096,
    "do_layer_norm_before": True,
    "torch_dtype": "float16",
    "bos_token_id": 2,
    "eos_token_id": 2,
    "pad_token_id": 1,
}


def agent(side, rank):
    """kvgeom's agent name of a rank."""
    return f"{side}-{rank}"


class _TP:
    rank = 0
    size = 1


# vLLM's NIXL version check (absent from some releases: then nothing to
# switch off for the stand-in).
_check_nixl_version = compat.nixl_version_check(base_worker)
base_worker.NixlWrapper = fake_nixl.FakeNixlWrapper


def _set_nixl_version_check(check):
    compat.set_nixl_version_check(base_worker, check)


_set_nixl_version_check(lambda *a, **k: None)


def use_nixl(kind):
    """vLLM's workers get real NIXL agents (kind "real", once
    real_nixl.probe() succeeded) or the stand-in ("stand-in")."""
    if kind == "real":
        import importlib

        real_nixl.RealNixlWrapper.api = importlib.import_module("nixl._api")
        base_worker.NixlWrapper = real_nixl.RealNixlWrapper
        _set_nixl_version_check(_check_nixl_version)
    else:
        base_worker.NixlWrapper = fake_nixl.FakeNixlWrapper
        _set_nixl_version_check(lambda *a, **k: None)


base_worker.get_tensor_model_parallel_rank = lambda: _TP.rank
base_worker.get_tensor_model_parallel_world_size = lambda: _TP.size

_real_platform = base_worker.current_platform


class _Platform:
    """The platform as a CUDA machine; everything else from the real one."""

    device_type = "cuda"

    def get_nixl_memory_type(self):
        return None

    def set_device(self, device):
        return None

    def synchronize(self, *args, **kwargs):
        return None

    def __getattr__(self, name):
        return getattr(_real_platform, name)


base_worker.current_platform = _Platform()

# Host tensors on a CPU-only machine: no pinned staging copies.
import vllm.utils.torch_utils as _torch_utils  # noqa: E402

compat.pin_memory_off(_torch_utils)
# Every compatibility hash the workers compute, with its factors.
compat_hash.capture()

_MODEL_DIR = [None]


def model_dir():
    if _MODEL_DIR[0] is None:
        d = tempfile.mkdtemp(prefix="kvgeom-opt-config-")
        # One folder per driver process, and a sweep may start several.
        atexit.register(shutil.rmtree, d, ignore_errors=True)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(OPT_CONFIG, f)
        _MODEL_DIR[0] = d
    return _MODEL_DIR[0]


class _Backend:
    """Stand-in attention backend: a name and the page shape."""

    name = "FLASH_ATTN"

    @classmethod
    def get_name(cls):
        return cls.name

    @classmethod
    def get_supported_kernel_block_sizes(cls, *args, **kwargs):
        return [cls.kernel]

    @classmethod
    def full_cls_name(cls):
        return ("kvgeom", cls.name)


def engine_compat(geometry, side):
    """What the geometry states `side` hashes at the handshake (its backend,
    KV-cache dtype) and whether the check is on; absent: one backend for
    both engines, the check on."""
    handshake = geometry.get("handshake") or {}
    return handshake.get(side) or {}, handshake.get("enforce", True)


def backend_for(geometry, side):
    """The stand-in backend of `side`: the name its geometry states, else one
    name for both engines from the attention kind."""
    attn = geometry["model"].get("attention") or {}
    stated = engine_compat(geometry, side)[0].get("backend")
    name = stated or ("FLASHMLA" if attn.get("kind") == "mla" else "FLASH_ATTN")
    kernel = geometry[side]["kernel_block"]
    return type(f"Backend_{name.replace(',', '_')}", (_Backend,), {"name": name, "kernel": kernel})


class Unsupported(Exception):
    pass


def vllm_layout_name(engine):
    return {"NHD": "LBNHC", "HND": "LBHNC"}.get(engine.get("layout", "NHD"), engine.get("layout"))


def build_vllm_config(geometry, engine, side, tp_size):
    from vllm.config import (
        CacheConfig,
        DeviceConfig,
        KVTransferConfig,
        ModelConfig,
        ParallelConfig,
        VllmConfig,
    )

    model_config = ModelConfig(model=model_dir(), skip_tokenizer_init=True)
    attn = geometry["model"].get("attention") or {}
    if attn.get("kind") == "mla":
        model_config.__class__ = _mla_model_config_class(type(model_config))
    elif attn:
        heads = attn["total_kv_heads"]
        model_config.get_total_num_kv_heads = lambda: heads
    compat_settings, enforce = engine_compat(geometry, side)
    cache = CacheConfig(
        block_size=engine["logical_block"],
        enable_prefix_caching=engine.get("prefix_caching", False),
    )
    # Hashed at the handshake only: the bytes per element come from the
    # geometry's own tables.
    if compat_settings.get("kv_cache_dtype"):
        cache.cache_dtype = compat_settings["kv_cache_dtype"]
    cache.kv_cache_layout = vllm_layout_name(engine)
    kvt = KVTransferConfig(
        kv_connector="NixlConnector",
        kv_role="kv_consumer" if side == "decode" else "kv_producer",
        # A host-buffer engine stages through CPU buffers; otherwise pin the
        # buffer to the faked device, as on a GPU.
        kv_buffer_device="cpu" if engine.get("host_buffer") else "cuda",
        # The deployer's `enforce_handshake_compat` (vLLM's default: on).
        kv_connector_extra_config={"enforce_handshake_compat": bool(enforce)},
    )
    config = VllmConfig(
        model_config=model_config,
        cache_config=cache,
        parallel_config=ParallelConfig(tensor_parallel_size=tp_size),
        kv_transfer_config=kvt,
        device_config=DeviceConfig(device="cpu"),
    )
    if geometry["model"].get("mamba") is not None:
        # The hybrid allocator, as on a GPU platform (the CPU platform turns
        # it off; NIXL supports it and a mamba hybrid needs it).
        config.scheduler_config.disable_hybrid_kv_cache_manager = False
    return config


_MLA_CLASSES = {}


def _mla_model_config_class(cls):
    """The model config class with `use_mla` true (the OPT config is not MLA)."""
    if cls not in _MLA_CLASSES:
        _MLA_CLASSES[cls] = type(f"MLA{cls.__name__}", (cls,), {"use_mla": property(lambda self: True)})
    return _MLA_CLASSES[cls]


def warm():
    """Build one model config before the first case (its first build is slow)."""
    from vllm.config import ModelConfig

    ModelConfig(model=model_dir(), skip_tokenizer_init=True)


def dtype_of(nbytes):
    """A torch dtype of `nbytes` bytes per element (the geometry states sizes only)."""
    return {1: torch.uint8, 2: torch.bfloat16, 4: torch.float32, 8: torch.float64}[nbytes]


def attention_spec(attn, engine):
    """vLLM's spec of one attention layer on one rank of `engine`."""
    logical = engine["logical_block"]
    if attn["kind"] == "mla":
        return kvi.MLAAttentionSpec(
            block_size=logical,
            num_kv_heads=1,
            head_size=attn["head_size"],
            dtype=dtype_of(attn["dtype_bytes"]),
        )
    heads = max(1, attn["total_kv_heads"] // engine["tp_size"])
    return kvi.FullAttentionSpec(
        block_size=logical,
        num_kv_heads=heads,
        head_size=attn["head_size"],
        dtype=dtype_of(attn["dtype_bytes"]),
    )


def rank_channels(mamba, j, tp):
    """Conv channels of sub-projection j on one rank (kvgeom's geometry rule:
    Mamba2's B and C stay whole when TP does not divide n_groups)."""
    dim = mamba["conv_dims"][j]
    groups = mamba.get("n_groups")
    if mamba["kind"] == "mamba2" and j > 0 and groups is not None and groups % tp != 0:
        return dim // groups
    return dim // tp


def _temporal_shape(lead, width, ssm_bytes, what):
    """A temporal-state shape `lead + (width, rest)` holding `ssm_bytes` in the
    widest dtype that divides it; vLLM reads `width` back as the channels of
    the sub-projection named by `what`."""
    for dtype in (torch.float32, torch.float16, torch.uint8):
        size = torch.tensor([], dtype=dtype).element_size()
        if ssm_bytes % (width * size) == 0:
            return lead + (width, ssm_bytes // (width * size)), dtype
    raise Unsupported(
        f"{what}: one rank's SSM state ({ssm_bytes} bytes) is not a whole number of "
        f"rows of {width} channels, so no vLLM temporal-state shape gives "
        "vLLM's conv decomposition these channels"
    )


def mamba_spec(mamba, engine, page_bytes):
    """vLLM's MambaSpec of one mamba layer on one rank of `engine`: shapes and
    dtypes chosen so that vLLM's own conv decomposition
    (derive_mamba_conv_split) recovers kvgeom's sub-projections, and the
    page padded to the unified page."""
    from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum as Kinds

    tp = engine["tp_size"]
    kind = mamba["kind"]
    dims = [rank_channels(mamba, j, tp) for j in range(len(mamba["conv_dims"]))]
    rows = mamba["conv_rows"]
    conv_dtype = dtype_of(mamba["conv_dtype_bytes"])
    ssm_bytes = mamba["ssm_state_bytes"] // tp
    conv = (sum(dims), rows)
    if kind == "mamba1":
        # Temporal state (channels, state): vLLM checks channels == conv dim.
        temporal, ssm_dtype = _temporal_shape((), dims[0], ssm_bytes, "mamba1 x")
        vllm_kind = Kinds.MAMBA1
    elif kind == "mamba2":
        # Temporal state (heads, head_dim, state): vLLM takes x as
        # heads x head_dim and splits the rest of the conv dim into B = C.
        temporal, ssm_dtype = _temporal_shape((1,), dims[0], ssm_bytes, "mamba2 x")
        vllm_kind = Kinds.MAMBA2
    elif kind in ("gdn", "kda"):
        # vLLM 0.33.0 knows KDA's state only as GDN's (one conv tensor
        # Q | K | V, temporal (v_heads, v_dim, k_dim)); it takes V as
        # v_heads x v_dim and splits the rest into Q = K.
        if dims[0] != dims[1]:
            raise Unsupported(
                f"{kind} with Q ({dims[0]}) and K ({dims[1]}) of different widths: "
                "vLLM 0.33.0's conv decomposition splits Q | K evenly"
            )
        temporal, ssm_dtype = _temporal_shape((1,), dims[2], ssm_bytes, f"{kind} V")
        vllm_kind = Kinds.GDN_ATTN
    else:
        raise Unsupported(f"mamba kind {kind!r}")
    spec = kvi.MambaSpec(
        block_size=engine["logical_block"],
        shapes=(conv, temporal),
        dtypes=(conv_dtype, ssm_dtype),
        page_size_padded=page_bytes,
        mamba_type=vllm_kind,
    )
    check_conv_decomposition(spec, tp, dims, mamba)
    return spec


def check_conv_decomposition(spec, tp, dims, mamba):
    """vLLM's own decomposition of `spec` must give kvgeom's sub-projections."""
    from vllm.distributed.kv_transfer.kv_connector.v1.ssm_conv_transfer_utils import (
        derive_mamba_conv_split,
    )

    split = derive_mamba_conv_split(spec, tp)
    row_bytes = mamba["conv_rows"] * mamba["conv_dtype_bytes"]
    want = []
    offset = 0
    for d in dims:
        want.append((offset, d * row_bytes))
        offset += d * row_bytes
    if list(split.local_conv_offsets) != want:
        raise Unsupported(
            f"{mamba['kind']} at TP {tp}: vLLM's conv decomposition gives sub-projections "
            f"{list(split.local_conv_offsets)}, kvgeom's geometry {want}"
        )


def layer_name(slot, group, kind):
    """One layer of a KV-cache group; every group's layer `slot` shares tensor `slot`."""
    return f"model.layers.{slot}.group{group}.{'mixer' if kind == 'mamba' else 'self_attn'}"


def build_engine(spec, side, rank, case_dir):
    """vLLM's KV-cache config and tensors for one rank, loaded from kvgeom's files."""
    geometry = spec["geometry"]
    model = geometry["model"]
    engine = geometry[side]
    s = spec[side]
    if engine.get("block_padding_bytes", 0) and model.get("mamba") is not None:
        raise Unsupported("hybrid geometries with padded kernel pages (block_padding_bytes)")
    kernel = engine["kernel_block"]
    logical = engine["logical_block"]
    num_blocks = s["num_logical_blocks"]
    slots = s["regions"]
    region_bytes = s["region_bytes"]
    page_bytes = s["page_bytes"]
    groups = []
    tensors_spec = []
    kernel_blocks = []
    for g, kind in enumerate(model["groups"]):
        if kind == "attention":
            group_spec = attention_spec(model["attention"], engine)
            kernel_blocks.append(kernel)
        elif kind == "mamba":
            group_spec = mamba_spec(model["mamba"], engine, page_bytes)
            kernel_blocks.append(logical)
        else:
            raise Unsupported(f"KV-cache group kind {kind!r}")
        # A partly filled group (`state_slots`): the mamba layers lie in the
        # first slots only; the others hold attention layers alone.
        held = slots
        if kind == "mamba" and model.get("state_slots") is not None:
            held = model["state_slots"]
        names = [layer_name(i, g, kind) for i in range(held)]
        groups.append(kvi.KVCacheGroupSpec(layer_names=names, kv_cache_spec=group_spec))
        # One backing allocation that every group overlays: layer l's pages
        # start l regions in (the layer-compact layouts LBNHC/LBHNC), as the
        # engine core resolves them under the hybrid allocator.
        tensors_spec.append(
            kvi.KVCacheTensor(
                size=region_bytes * slots,
                layers=list(names),
                layer_stride=region_bytes,
                block_stride=page_bytes,
            )
        )
    kv_cache_config = kvi.KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=tensors_spec,
        kv_cache_groups=groups,
    )
    layout = KVCacheLayout[vllm_layout_name(engine)]
    kv_cache_config.kv_cache_layout = layout.name
    tensors = allocate_kv_cache(kv_cache_config, torch.device("cpu"), layout, kernel_blocks)
    base = next(iter(tensors.values())).untyped_storage().data_ptr()
    raw = []
    for i in range(slots):
        path = os.path.join(case_dir, f"{agent(side, rank)}.r{i}.in")
        data = open(path, "rb").read()
        if len(data) != region_bytes:
            raise Unsupported(f"{path}: {len(data)} bytes, expected {region_bytes}")
        addr = base + i * region_bytes
        ctypes.memmove(addr, data, region_bytes)
        raw.append((addr, region_bytes))
    return kv_cache_config, tensors, raw


def _plain(value):
    """Tuples and ints of vLLM's arguments as JSON values."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    return int(value)


# The zeroed ranges of a receive post-process call are measured only on an
# agent whose regions hold at most this many bytes in all.
ZERO_MEASURE_LIMIT = 64 << 20

_ZERO_RUN = re.compile(rb"\x00+")


def zeroed_by(regions, call):
    """The byte ranges `call` sets to zero in `regions` (`(addr, bytes)`
    each), as `[addr, len]` runs; None when the regions are too large to
    measure or the call raised.

    The call runs once over memory filled with 0xFF: a block-size
    conversion only moves bytes, so every zero byte afterwards is one the
    call wrote. The memory is then put back as it was, for the real call."""
    if sum(n for _, n in regions) > ZERO_MEASURE_LIMIT:
        return None
    saved = [ctypes.string_at(addr, n) for addr, n in regions]
    try:
        for addr, n in regions:
            ctypes.memset(addr, 0xFF, n)
        call()
        ranges = []
        for addr, n in regions:
            for run in _ZERO_RUN.finditer(ctypes.string_at(addr, n)):
                ranges.append([addr + run.start(), run.end() - run.start()])
        return ranges
    except Exception:
        return None
    finally:
        for (addr, n), data in zip(regions, saved):
            ctypes.memmove(addr, data, n)


# Test hook: `post-process` makes the driver's recorder of the receive
# post-process raise inside the driver's own code (a harness error, never a
# verdict on vLLM: tests/live/live_vllm.rs); `every-pull-case` makes every
# direct pull case raise before its first read, the canary included (the
# release is then not run).
FAULT_ENV = "KVGEOM_DRIVER_TEST_FAULT"


def watch_post_process(worker, name, result, regions, skip=False):
    """Record every call of the worker's receive post-process (its
    block-size ratio, per request the blocks converted and the sub-blocks
    covered, whether it converts, and the byte ranges it zeroes) in
    `result["post_process_calls"]`, and every call of its region-mapped
    zeroing (`_zero_region_blocks`) in `result["region_zero_calls"]`; then
    run them (or not, under the test hook `skip`). `regions` are the
    agent's `(addr, bytes)` regions."""
    calls = result.setdefault("post_process_calls", [])
    region_calls = result.setdefault("region_zero_calls", [])
    # Either may be absent from another vLLM (api_check.py: optional): its
    # calls are then not recorded.
    run = getattr(worker, "post_process_device_kv_on_receive", None)
    run_region = getattr(worker, "_zero_region_blocks", None)

    def recorded(block_size_ratio, block_ids_list, convert=True):
        if os.environ.get(FAULT_ENV) == "post-process":
            raise RuntimeError(f"{FAULT_ENV}=post-process: a fault put in the driver's post-process recorder")
        calls.append(
            {
                "agent": name,
                "block_size_ratio": _plain(block_size_ratio),
                # Releases whose entries name no group get it (compat.py).
                "block_ids_list": _plain([compat.post_process_entry(worker, e) for e in block_ids_list]),
                "convert": bool(convert),
                "zeroed": zeroed_by(regions, lambda: run(block_size_ratio, block_ids_list, convert)),
            }
        )
        if not skip:
            return run(block_size_ratio, block_ids_list, convert)
        return None

    def recorded_region(block_ids):
        region_calls.append(
            {
                "agent": name,
                "region_block_ids": _plain(block_ids),
                "zeroed": zeroed_by(regions, lambda: run_region(block_ids)),
            }
        )
        if not skip:
            return run_region(block_ids)
        return None

    if run is not None:
        worker.post_process_device_kv_on_receive = recorded
    if run_region is not None:
        worker._zero_region_blocks = recorded_region


class RegistrationRaised(Exception):
    """vLLM's `register_kv_caches` raised on one rank: the engine fails at
    start, a verdict on the connector (not a limit of the driver's build)."""

    def __init__(self, side, rank, cause):
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.side, self.rank, self.cause = side, rank, cause

    def result(self):
        return {
            "status": "crashed",
            "side": self.side,
            "message": f"{agent(self.side, self.rank)} register_kv_caches: {self}",
            "trace": "".join(traceback.format_exception(self.cause)),
        }


def make_worker(spec, side, rank, fabric, case_dir, worker_cls=NixlConnectorWorker):
    _, w, raw = build_rank(spec, side, rank, fabric, case_dir, worker_cls=worker_cls)
    return w, raw


def make_connector(spec, side, rank, fabric, case_dir, connector_cls):
    """One rank as vLLM's model runner holds it: the connector (the class
    vLLM's KV-transfer layer builds, `connector_cls`, in its worker role)
    with its worker inside. `(connector, worker, raw regions)`."""
    return build_rank(spec, side, rank, fabric, case_dir, connector_cls=connector_cls)


def build_rank(spec, side, rank, fabric, case_dir, worker_cls=NixlConnectorWorker, connector_cls=None):
    geometry = spec["geometry"]
    engine = geometry[side]
    cfg = build_vllm_config(geometry, engine, side, engine["tp_size"])
    kv_cache_config, tensors, raw = build_engine(spec, side, rank, case_dir)
    backend = backend_for(geometry, side)
    base_worker.get_current_attn_backends = lambda *a, **k: [backend]
    _TP.rank, _TP.size = rank, engine["tp_size"]
    fabric.pending_alias = agent(side, rank)
    if connector_cls is None:
        conn = None
        w = worker_cls(cfg, side, kv_cache_config)
    else:
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

        # The connector builds its worker with the config's engine id: the
        # engine's name, as the scheduler's metadata names it.
        cfg.kv_transfer_config.engine_id = side
        conn = connector_cls(cfg, KVConnectorRole.WORKER, kv_cache_config)
        w = conn.connector_worker
    try:
        (conn or w).register_kv_caches(tensors)
    except Exception as e:
        raise RegistrationRaised(side, rank, e) from e
    return conn, w, raw


# Set by the driver when the batch records traces: pull cases then also
# record what their v1 traces need (`trace_v1.Recorder`), left in
# V1_RECORDER[0] (with the fabric's agent names) for the driver to write.
RECORD_V1 = [False]
V1_RECORDER = [None]


def run(spec, case_dir):
    V1_RECORDER[0] = None
    if spec["mode"] not in ("pull", "push"):
        return {"status": "error", "message": f"mode {spec['mode']!r}: the driver runs pull and push"}
    placed = None
    if spec.get("requests") == "scheduler":
        import place_case

        try:
            placed = place_case.load_metas(case_dir, spec)
        except place_case.SchedulerRequestsError as e:
            return {"status": "error", "message": f"the driver cannot build this case: {e}"}
    if spec["mode"] == "push":
        import push_case

        return push_case.run(spec, case_dir, placed)
    fabric = fake_nixl.Fabric()
    fake_nixl.FABRIC[0] = fabric
    if RECORD_V1[0]:
        fabric.v1 = trace_v1.Recorder()
        fabric.v1.nixl_cls = base_worker.NixlWrapper.__name__
        V1_RECORDER[0] = (fabric.v1, fabric.alias)
    ranks = {}
    started = time.time()
    try:
        return _run_pull(spec, case_dir, fabric, ranks, placed)
    finally:
        if fabric.v1 is not None:
            fabric.v1.duration_s = round(time.time() - started, 4)
        # Real NIXL agents release their handles and registrations before
        # the case's tensors go.
        for w, _ in ranks.values():
            with contextlib.suppress(Exception):
                w.shutdown()
        fabric.close()


def _run_pull(spec, case_dir, fabric, ranks, placed=None):
    geometry = spec["geometry"]
    connectors = {}
    try:
        for side in ("prefill", "decode"):
            for r in range(geometry[side]["tp_size"]):
                if placed is None:
                    ranks[(side, r)] = make_worker(spec, side, r, fabric, case_dir)
                else:
                    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.connector import NixlPullConnector

                    conn, w, raw = make_connector(spec, side, r, fabric, case_dir, NixlPullConnector)
                    connectors[(side, r)] = conn
                    ranks[(side, r)] = (w, raw)
                if side == "decode" and fabric.v1 is not None:
                    fabric.v1.local_geometry(ranks[(side, r)][0])
    except Unsupported as e:
        return {"status": "error", "message": f"the driver cannot build this case: {e}"}
    except RegistrationRaised as e:
        return e.result()
    except Exception as e:
        # vLLM's own classes refused what the driver built (a spec, a view,
        # the worker): a driver limit, not a verdict on the connector.
        return {
            "status": "error",
            "message": f"vLLM's classes refused the driver's build of this case: {type(e).__name__}: {e}",
            "trace": traceback.format_exc(),
        }
    regions = {}
    for (side, r), (w, raw) in ranks.items():
        regions[agent(side, r)] = list(raw)
    result = {"regions": regions, "handshakes": [], "post_process": []}
    p_tp = geometry["prefill"]["tp_size"]
    d_tp = geometry["decode"]["tp_size"]
    for d in range(d_tp):
        dw, _ = ranks[("decode", d)]
        _TP.rank, _TP.size = d, d_tp
        for p in range(p_tp):
            pw, _ = ranks[("prefill", p)]
            sent = None
            # The hash first, as vLLM's `_nixl_handshake` compares it before
            # it decodes the agent metadata. Outside the `try`: a fault in
            # the driver's own comparison is a harness error, not a refusal.
            mismatch = compat_hash.pull_mismatch(dw, _handshake_payload(pw))
            if mismatch is not None:
                result.update(status="rejected", side="decode", message=f"RuntimeError: {mismatch}")
                return finish(result, ranks, fabric, case_dir)
            try:
                agent_meta = _agent_metadata(pw)
                # What prefill sent, before decode's handshake rewrites the
                # metadata in place (a remote block larger than decode's
                # kernel block is viewed as several smaller ones).
                sent = trace_v1.snapshot_metadata(agent_meta) if fabric.v1 is not None else None
                name = dw.add_remote_agent(agent_meta, remote_tp_rank=p, remote_tp_size=p_tp)
                if fabric.v1 is not None:
                    fabric.v1.add_remote_agent(dw, sent, p, p_tp, name, None)
                # What the handshake's completion records (the caller's part).
                dw._remote_agents["prefill"][(0, p)] = name
                dw._engine_clock_offset["prefill"] = 0.0
                result["handshakes"].append({"agent": agent("decode", d), "remote": agent("prefill", p), "ok": True})
            except Exception as e:
                if fabric.v1 is not None and sent is not None:
                    fabric.v1.add_remote_agent(dw, sent, p, p_tp, None, f"{type(e).__name__}: {e}")
                result.update(status="rejected", side="decode", message=f"{type(e).__name__}: {e}", trace=traceback.format_exc())
                return finish(result, ranks, fabric, case_dir)
    if placed is not None:
        return _scheduler_requests(spec, placed, ranks, connectors, fabric, result, regions, case_dir)
    dw, req = None, None
    try:
        if os.environ.get(FAULT_ENV) == "every-pull-case":
            raise RuntimeError(f"{FAULT_ENV}=every-pull-case: a fault put in the driver's pull case")
        for d in range(d_tp):
            dw, _ = ranks[("decode", d)]
            req = None
            _TP.rank, _TP.size = d, d_tp
            req = ReqMeta(
                local_block_ids=tuple(tuple(g) for g in spec["decode"]["transfer_blocks"]),
                local_physical_block_ids=dw._logical_to_kernel_block_ids(
                    [list(g) for g in spec["decode"]["transfer_blocks"]],
                    dw._physical_blocks_per_logical_kv_block,
                ),
                tp_size=p_tp,
                local_num_computed_blocks=tuple(spec["decode"]["computed_blocks"]),
                remote=RemoteMeta(
                    block_ids=[list(g) for g in spec["prefill"]["request_blocks"]],
                    host="localhost",
                    port=0,
                    engine_id="prefill",
                    request_id="req-p",
                    num_tokens=spec["transferred_tokens"],
                ),
            )
            dw._recving_metadata["req-d"] = req
            watch_post_process(dw, agent("decode", d), result, regions[agent("decode", d)], spec.get("skip_receive_post_process"))
            if fabric.v1 is not None:
                fabric.v1.request(dw, "req-d", spec, req)
            dw._read_blocks_for_req("req-d", req)
            done_recving, failed = compat.received(dw)
            # Real NIXL may still be moving the bytes: ask again while the
            # request's transfers are in flight (the stand-in's are done).
            while "req-d" not in done_recving and dw._recving_transfers.get("req-d"):
                time.sleep(0.0005)
                more, more_failed = compat.received(dw)
                done_recving |= more
                failed |= more_failed
            if "req-d" in failed:
                # vLLM skipped the post-process and would free the blocks.
                if fabric.v1 is not None:
                    fabric.v1.request_done(dw, "req-d", req, "failed_recving")
                result.update(status="rejected", side="decode",
                              message=f"{agent('decode', d)} reported the request failed (failed_recving)")
                return finish(result, ranks, fabric, case_dir)
            result["post_process"].append({"agent": agent("decode", d), "done_recving": sorted(done_recving)})
            if fabric.v1 is not None:
                fabric.v1.request_done(dw, "req-d", req)
    except Exception as e:
        if fabric.v1 is not None and req is not None:
            fabric.v1.request_done(dw, "req-d", req, f"{type(e).__name__}: {e}")
        result.update(failure.outcome(e, "decode"))
        return finish(result, ranks, fabric, case_dir)
    result["status"] = "done"
    return finish(result, ranks, fabric, case_dir)


def transfer_results(conn):
    """One completion call on a connector, as the model runner makes it:
    `(finished_recving, failed_recving)`. `get_transfer_results` where the
    connector has it (failed receives included), else the older
    `get_finished` (no failed receives)."""
    if hasattr(type(conn), "get_transfer_results"):
        results = conn.get_transfer_results(set())
        return set(results.finished_recving or ()), set(getattr(results, "failed_recving", None) or ())
    _, recving = conn.get_finished(set())
    return set(recving or ()), set()


def engine_step(conn, meta):
    """What vLLM's model runner does with one step's connector metadata:
    bind it, start the loads (the NIXL connector does not read the forward
    context, so none is built), ask for finished transfers, clear it."""
    conn.bind_connector_metadata(meta)
    try:
        conn.start_load_kv(None)
        return transfer_results(conn)
    finally:
        conn.clear_connector_metadata()


def _scheduler_requests(spec, placed, ranks, connectors, fabric, result, regions, case_dir):
    """Prefill's ranks, then decode's, get the request as vLLM's scheduler
    built it: each rank its own unpickled copy of each of its engine's
    steps, bound and started through the connector (`engine_step`);
    decode's completion is asked for as the engine asks, while the
    request's reads are in flight."""
    import place_case

    _, pkl = placed
    req_id = pkl["request_ids"]["decode"]
    d_tp = spec["geometry"]["decode"]["tp_size"]
    p_tp = spec["geometry"]["prefill"]["tp_size"]
    try:
        # Prefill's ranks first get prefill's steps (the request in a batch,
        # then finished: the lease on its blocks), as its engine ran them
        # before decode got the request.
        for p in range(p_tp):
            _TP.rank, _TP.size = p, p_tp
            for step in pkl["prefill"]:
                engine_step(connectors[("prefill", p)], place_case.unpickle(step))
    except Exception as e:
        result.update(failure.outcome(e, "prefill"))
        return finish(result, ranks, fabric, case_dir)
    dw, req = None, None
    try:
        for d in range(d_tp):
            conn = connectors[("decode", d)]
            dw, _ = ranks[("decode", d)]
            req = None
            _TP.rank, _TP.size = d, d_tp
            watch_post_process(dw, agent("decode", d), result, regions[agent("decode", d)], spec.get("skip_receive_post_process"))
            done_recving, failed = set(), set()
            for step in pkl["decode"]:
                meta = place_case.unpickle(step)
                req = meta.reqs_to_recv.get(req_id, req)
                if fabric.v1 is not None and req_id in meta.reqs_to_recv:
                    fabric.v1.request(dw, req_id, spec, req)
                recving, newly_failed = engine_step(conn, meta)
                done_recving |= recving
                failed |= newly_failed
            while req_id not in done_recving | failed and dw._recving_transfers.get(req_id):
                time.sleep(0.0005)
                recving, newly_failed = transfer_results(conn)
                done_recving |= recving
                failed |= newly_failed
            entry = {"agent": agent("decode", d), "done_recving": sorted(done_recving)}
            if failed:
                entry["failed_recving"] = sorted(failed)
            result["post_process"].append(entry)
            if fabric.v1 is not None and req is not None:
                fabric.v1.request_done(dw, req_id, req)
            if req_id in failed:
                result.update(status="rejected", side="decode", message=f"decode-{d} reported {req_id} failed (failed_recving)")
                return finish(result, ranks, fabric, case_dir)
    except Exception as e:
        if fabric.v1 is not None and req is not None:
            fabric.v1.request_done(dw, req_id, req, f"{type(e).__name__}: {e}")
        result.update(failure.outcome(e, "decode"))
        return finish(result, ranks, fabric, case_dir)
    result["status"] = "done"
    return finish(result, ranks, fabric, case_dir)


def _handshake_payload(worker):
    """What `worker` answers a handshake with (one payload per rank)."""
    payload = worker.xfer_handshake_metadata
    if isinstance(payload, dict):
        payload = next(iter(payload.values()))
    return payload


def _agent_metadata(worker):
    import msgspec

    payload = _handshake_payload(worker)
    raw = getattr(payload, "agent_metadata_bytes", None)
    if raw is None:
        return payload
    return msgspec.msgpack.decode(raw, type=NixlAgentMetadata)


def finish(result, ranks, fabric, case_dir):
    for (side, r), (w, raw) in ranks.items():
        for i, (addr, length) in enumerate(raw):
            with open(os.path.join(case_dir, f"{agent(side, r)}.r{i}.out"), "wb") as f:
                f.write(ctypes.string_at(addr, length))
    name = fabric.name_of
    result["dlists"] = [
        {**d, "agent": name(d["agent"]), "target": d["target"] if d["target"] == "local" else name(d["target"])}
        for d in fabric.dlists
    ]
    result["xfers"] = [
        {k: v for k, v in {**x, "agent": name(x["agent"])}.items() if k != "notif"} for x in fabric.xfers
    ]
    return result
