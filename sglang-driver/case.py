"""One P/D case on SGLang's own NIXL KV manager, on a CPU.

Per rank of each engine (prefill ranks first, then decode ranks):

1. SGLang's runtime context is published for that rank (`ServerArgs` with the
   engine's TP size, `disaggregation_mode`, `disaggregation_transfer_backend
   = "nixl"`, `page_size`, `device = "cuda"`; `SpawnRanks(world_rank = rank,
   gpu_id = rank)`), as the rank's scheduler process would have it;
2. a real pool is built on the CPU (`MHATokenToKVPool`, `MLATokenToKVPool`)
   with SGLang's `MetadataBuffers` (the aux rows);
3. the KV args are assembled the way the rank's `_init_kv_manager`
   (`disaggregation/prefill.py`, `decode.py` of 0.5.23) does: `KVArgs()`, then
   `get_kv_transfer_buf_infos`, `build_kv_layer_ids`, `get_pd_kv_layout`,
   `setup_state_kv_args` and the metadata buffers' `get_buf_infos` (the one
   part the driver mirrors: `mirror_init_kv_manager` below);
4. `NixlKVManager(kv_args, mode, server_args, is_mla)` is built: its real
   `__init__` creates the agent (the stand-in), registers the buffers, starts
   prefill's transfer-worker threads and bootstrap thread, decode's listener
   and heartbeat threads, and a prefill rank registers itself in the
   bootstrap table (`register_to_bootstrap`).

Then the request, through SGLang's own classes: `NixlKVSender` per prefill
rank (as prefill's scheduler makes it), then per decode rank
`try_ensure_parallel_info` (the rank mapping), `NixlKVReceiver(...).init()`
(which sends decode's registration frames) and `send_metadata` (the request's
pages); prefill's bootstrap thread parses them (`KVArgsRegisterInfo.from_zmq`,
`TransferInfo.from_zmq`) and prepares the peer (`_add_remote_peer`). Once a
sender reports `WaitingForInput` the driver calls its `init(num_pages,
aux_index)` and `send(pages)`; SGLang's transfer worker runs the send path and
reports the status to decode, whose listener thread applies it.
"""

import contextlib
import os
import threading
import time
import traceback

import numpy as np

import compat
import fake_nixl
import hybrid
import inproc

FORMAT = "kvgeom-sglang-result/1"
DTYPES = {"bfloat16": "bfloat16", "float16": "float16", "float32": "float32", "uint8": "uint8"}

S = {}  # SGLang's modules and the process-wide patches, once per process
THREAD_ERRORS = []


class DriverError(Exception):
    """The driver cannot build this case."""


def load(nixl=fake_nixl):
    """Import SGLang once per process, with `nixl` (the stand-in, or
    real_nixl's recording agents) serving NIXL and SGLang's transport names
    pointed at the in-process hub."""
    if S:
        return S
    # SGLang's own override of its local-IP detection: every address it binds
    # or advertises is loopback.
    os.environ["SGLANG_HOST_IP"] = inproc.LOOPBACK
    os.environ.pop("HOST_IP", None)
    nixl.install()
    import torch

    t0 = time.time()
    import sglang
    from sglang.srt.disaggregation.base import conn as base_conn
    from sglang.srt.disaggregation.common import conn as common_conn
    from sglang.srt.disaggregation.nixl import conn as nixl_conn
    from sglang.srt.disaggregation import utils as disagg_utils
    from sglang.srt.mem_cache import memory_pool
    try:
        from sglang.srt import runtime_context
    except ImportError:  # before 0.5.14: the topology is read through module functions (compat.py)
        runtime_context = None
    from sglang.srt.server_args import ServerArgs

    S.update(
        torch=torch,
        sglang=sglang,
        base_conn=base_conn,
        common_conn=common_conn,
        nixl_conn=nixl_conn,
        disagg_utils=disagg_utils,
        memory_pool=memory_pool,
        runtime_context=runtime_context,
        ServerArgs=ServerArgs,
        import_s=time.time() - t0,
    )
    inproc.patch(common_conn)
    hybrid.install_recorder(S)
    # The release's API profile (compat.py): how a rank's context is
    # published, the KV args assembled, a sender made, decode told.
    S["profile"] = compat.detect(runtime_context, disagg_utils, nixl_conn)
    S["compat"] = compat.Context(S)
    S["compat"].setup_process()
    # The device module's set_device, which NixlKVManager calls for the
    # published device ("cuda") before creating the NIXL backend: there is
    # no GPU here; recorded, nothing else.
    S["set_device_calls"] = []
    torch.cuda.set_device = lambda device: S["set_device_calls"].append(int(device))

    def excepthook(args):
        if issubclass(args.exc_type, SystemExit):
            return  # a thread the driver ended (inproc.StopThread), or sys.exit
        THREAD_ERRORS.append(
            {
                "thread": args.thread.name if args.thread else None,
                "type": args.exc_type.__name__,
                "message": str(args.exc_value),
                "exc": args.exc_value,
                "trace": "".join(traceback.format_exception(args.exc_type, args.exc_value, args.exc_traceback)),
            }
        )

    threading.excepthook = excepthook
    return S


@contextlib.contextmanager
def topology(server_args, rank):
    """Publish one rank's runtime context (process-global in SGLang)."""
    # No torch.distributed groups are built: the pipeline group, which the
    # managers keep but use only with PP > 1, is stated absent (compat.py).
    token = S["compat"].enter(server_args, rank)
    try:
        yield
    finally:
        S["compat"].exit(token)


def server_args(role, engine, case):
    return S["ServerArgs"](
        model_path="dummy",
        tp_size=engine["tp_size"],
        disaggregation_mode=role,
        disaggregation_transfer_backend="nixl",
        page_size=engine.get("page_size", case["page_size"]),
        kv_cache_dtype=engine.get("kv_cache_dtype", "auto"),
        device="cuda",
    )


def torch_dtype(name):
    return getattr(S["torch"], DTYPES[name])


def build_pool(model, engine, case, tp_size):
    """SGLang's own pool for one rank, on the CPU."""
    mp = S["memory_pool"]
    page_size = engine.get("page_size", case["page_size"])
    size = engine["num_pages"] * page_size
    dtype = torch_dtype(model.get("dtype", "bfloat16"))
    if model.get("state") is not None:
        return hybrid.build_pool(S, model, engine, case, tp_size, size, page_size, dtype)
    if model["attention"] == "mla":
        return mp.MLATokenToKVPool(
            size=size,
            page_size=page_size,
            dtype=dtype,
            kv_lora_rank=model["kv_lora_rank"],
            qk_rope_head_dim=model["qk_rope_head_dim"],
            layer_num=model["layers"],
            device="cpu",
            enable_memory_saver=False,
        )
    total = model["total_kv_heads"]
    heads = max(1, total // tp_size)  # SGLang replicates heads when TP > heads
    return mp.MHATokenToKVPool(
        size=size,
        page_size=page_size,
        dtype=dtype,
        head_num=heads,
        head_dim=model["head_dim"],
        layer_num=model["layers"],
        device="cpu",
        enable_memory_saver=False,
        v_head_dim=model.get("v_head_dim"),
    )


def mirror_init_kv_manager(role, rank, pool, meta, model):
    """The KV args of SGLang 0.5.23's `_init_kv_manager` for a pool without a
    draft model, hisparse, staging, PP or state (prefill.py:257, decode.py:608),
    under the rank's published context."""
    if S["profile"]["kv_buffers"] != "utils":
        return compat.kv_args(S, role, rank, pool, meta, model, S["compat"].attn_tp_size())
    rc = S["runtime_context"]
    du = S["disagg_utils"]
    kv_args = S["base_conn"].KVArgs()
    if role == "prefill":
        kv_args.engine_rank = rank
    else:
        kv_args.engine_rank = rank % rc.get_parallel().attn_tp_size
    kv_args.pp_rank = 0
    kv_args.system_dp_rank = rc.get_parallel().dp_rank
    kv_args.rust_http_port = None
    kv_args.kv_cache_dtype_str = rc.get_model().kv_cache_dtype
    kv_args.kv_layout = du.get_pd_kv_layout(pool)
    if role == "prefill":
        kv_args.prefill_start_layer = pool.start_layer
    ptrs, lens, item_lens = du.get_kv_transfer_buf_infos(pool)
    if role == "prefill":
        kv_args.prefill_end_layer = getattr(pool, "end_layer", None)
    kv_args.kv_data_ptrs = ptrs
    kv_args.kv_data_lens = lens
    kv_args.kv_item_lens = item_lens
    kv_args.num_draft_entries = 0
    kv_args.kv_layer_ids = du.build_kv_layer_ids(
        token_to_kv_pool=pool, draft_token_to_kv_pool=None, num_draft_entries=0,
        num_hidden_layers=model["layers"],
    )
    if role == "decode":
        kv_args.kv_data_mem_kinds = ["VRAM"] * len(ptrs)
    if role == "prefill" and not du.is_mla_backend(pool):
        # A hybrid pool (HybridLinearKVPool) is not an MLA backend to SGLang
        # even when its full-attention layers are MLA (prefill.py:195, 336):
        # the model config's total KV heads is then 1.
        kv_args.kv_head_num = pool.head_num
        kv_args.total_kv_head_num = 1 if model["attention"] == "mla" else model["total_kv_heads"]
    kv_args.page_size = pool.page_size
    kv_args.aux_data_ptrs, kv_args.aux_data_lens, kv_args.aux_item_lens = meta.get_buf_infos()
    kv_args.ib_device = rc.get_disagg().disaggregation_ib_device
    kv_args.gpu_id = rc.get_device().gpu_id
    du.setup_state_kv_args(kv_args, pool, None, model["layers"], req_to_token_pool=None)
    return kv_args


def global_head(rank, local_head, total_heads, tp_size):
    """The model's KV head a rank holds at a local head: heads split evenly,
    or each replicated over tp / heads consecutive ranks."""
    if tp_size <= total_heads:
        return rank * (total_heads // tp_size) + local_head
    return rank // (tp_size // total_heads)


class EndWorker:
    """Put on a transfer worker's queue at case end: reading its room ends
    the thread (outside SGLang's per-chunk try block)."""

    @property
    def room(self):
        raise inproc.StopThread()


class Rank:
    def __init__(self, role, rank, engine):
        self.role = role
        self.rank = rank
        self.name = f"{role}-{rank}"
        self.engine = engine
        self.server_args = None
        self.pool = None
        self.meta = None
        self.kv_args = None
        self.mgr = None
        self.sender = None
        self.receiver = None
        self.spec_model = None

    def kv_pool(self):
        """The pool holding the attention KV (a hybrid pool's full-attention pool)."""
        return getattr(self.pool, "full_kv_pool", self.pool)

    def regions(self):
        out = []
        ka = self.kv_args
        n = len(ka.kv_data_ptrs)
        mla = not hasattr(self.kv_pool(), "v_buffer")
        for i, (p, l, il) in enumerate(zip(ka.kv_data_ptrs, ka.kv_data_lens, ka.kv_item_lens)):
            what = f"layer {i}" if mla else (f"K layer {i}" if i < n // 2 else f"V layer {i - n // 2}")
            out.append({"index": i, "what": what, "addr": int(p), "len": int(l), "item_len": int(il)})
        return out

    def region_tensors(self):
        """Each KV region as a uint8 view of the pool's own buffer."""
        kv = self.kv_pool()
        if hasattr(kv, "v_buffer"):
            bufs = list(kv.k_buffer) + list(kv.v_buffer)
        else:
            bufs = list(kv.kv_buffer)
        views = [b.view(-1).view(S["torch"].uint8) for b in bufs]
        for v, p in zip(views, self.kv_args.kv_data_ptrs):
            if v.data_ptr() != p:
                raise DriverError(f"{self.name}: the pool's buffers are not the KV args' regions (order differs)")
        return views


def _poll_name(v):
    kp = S["base_conn"].KVPoll
    for name in ("Failed", "Bootstrapping", "WaitingForInput", "Transferring", "Success"):
        if getattr(kp, name) == v:
            return name
    return str(v)


class Case:
    """Runs one case dict (see README.md "The protocol")."""

    def __init__(self, spec, timeout_s=20.0):
        self.spec = spec
        self.timeout_s = float(spec.get("timeout_s", timeout_s))
        self.prefill = []
        self.decode = []
        self.result = {"format": FORMAT, "id": spec.get("id"), "nixl": "stand-in"}
        self.fabric = None
        self.hub = None
        self.stage = "build"

    # -- building --
    def build_rank(self, role, rank):
        engine = self.spec[role]
        r = Rank(role, rank, engine)
        model = self.spec["model"]
        r.spec_model = model
        try:
            r.server_args = server_args(role, engine, self.spec)
            with topology(r.server_args, rank):
                r.pool = build_pool(model, engine, self.spec, engine["tp_size"])
                r.meta = compat.metadata_buffers(S, engine.get("aux_slots", 4),
                                                 torch_dtype(model.get("dtype", "bfloat16")))
                r.kv_args = mirror_init_kv_manager(role, rank, r.pool, r.meta, model)
        except Exception as e:
            raise DriverError(f"{r.name}: {type(e).__name__}: {e}") from e
        try:
            self.fill(r)
        except hybrid.StateError as e:
            raise DriverError(f"{r.name}: {e}") from e
        mode = S["disagg_utils"].DisaggregationMode.PREFILL if role == "prefill" else S[
            "disagg_utils"].DisaggregationMode.DECODE
        self.fabric.pending_alias = r.name
        self.stage = f"{r.name}: NixlKVManager"
        with topology(r.server_args, rank):
            # SGLang's own is_mla_backend(pool), as prefill.py:195 / decode.py:413 decide it.
            r.mgr = S["nixl_conn"].NixlKVManager(r.kv_args, mode, r.server_args,
                                                 S["disagg_utils"].is_mla_backend(r.pool))
        r.mgr._kvgeom_agent = r.name
        self.hub.owner_of_port[r.mgr.rank_port] = r.name
        return r

    def fill(self, r):
        """Initial bytes: `<dir>/<agent>.r<i>.in` when the case has them,
        else the byte 0x5A on decode and, on prefill, seeded bytes per
        (region, model KV head): ranks that replicate a head (attention TP
        above the KV heads; every rank for MLA's latent) hold the same bytes
        for it, as on a real engine."""
        d = self.spec.get("dir")
        model = self.spec["model"]
        seed = int(self.spec.get("seed", 1))
        for i, view in enumerate(r.region_tensors()):
            path = os.path.join(d, f"{r.name}.r{i}.in") if d else None
            if path and os.path.exists(path):
                data = np.fromfile(path, dtype=np.uint8)
                if data.size != view.numel():
                    raise DriverError(f"{path}: {data.size} bytes, region {i} of {r.name} has {view.numel()}")
                view.copy_(S["torch"].from_numpy(data))
            elif r.role == "prefill":
                heads = 1 if model["attention"] == "mla" else r.pool.head_num
                tokens = (view.numel() // r.kv_args.kv_item_lens[i]) * r.kv_args.page_size
                rows = view.numpy().reshape(tokens, heads, -1)
                for h in range(heads):
                    g = 0 if model["attention"] == "mla" else global_head(r.rank, h, model["total_kv_heads"],
                                                                         r.engine["tp_size"])
                    rng = np.random.default_rng([seed, i, g])
                    rows[:, h, :] = rng.integers(0, 256, rows[:, h, :].shape, dtype=np.uint8)
            else:
                view.fill_(0x5A)
        if model.get("state") is None:
            return
        for i, view in enumerate(hybrid.state_views(r, S["torch"])):
            path = os.path.join(d, f"{r.name}.s{i}.in") if d else None
            if path and os.path.exists(path):
                data = np.fromfile(path, dtype=np.uint8)
                if data.size != view.numel():
                    raise DriverError(f"{path}: {data.size} bytes, state region {i} of {r.name} has {view.numel()}")
                view.copy_(S["torch"].from_numpy(data))
            elif r.role != "prefill":
                view.fill_(0x5A)
        if r.role == "prefill" and not (d and os.path.exists(os.path.join(d, f"{r.name}.s0.in"))):
            hybrid.fill_prefill(r, seed, S["torch"])

    # -- running --
    def run(self):
        load()
        THREAD_ERRORS.clear()
        hybrid.SLICE_CALLS.clear()
        hybrid.CONV_SOURCE.clear()
        self.fabric = fake_nixl.new_fabric()
        self.hub = inproc.new_hub()
        t0 = time.time()
        try:
            self._run()
        except (DriverError, hybrid.StateError) as e:
            self.finish("error", None, f"the driver cannot build this case: {e}", traceback.format_exc())
        except Exception as e:
            self.finish("error", None, f"unexpected in the driver at {self.stage}: {type(e).__name__}: {e}",
                        traceback.format_exc())
        self.result["wall_s"] = round(time.time() - t0, 3)
        self.collect()
        return self.result

    def _run(self):
        spec = self.spec
        room = int(spec.get("room", 4242))
        ps = spec["prefill"]["tp_size"]
        ds = spec["decode"]["tp_size"]
        if spec["model"].get("state") is not None:
            hybrid.validate(spec["model"])
        for rank in range(ps):
            self.stage = f"prefill-{rank}: build"
            try:
                self.prefill.append(self.build_rank("prefill", rank))
            except DriverError:
                raise
            except Exception as e:
                return self.finish("error", f"prefill-{rank}", "SGLang's classes refused the driver's build of this "
                                   f"case: NixlKVManager.__init__: {type(e).__name__}: {e}", traceback.format_exc())
        for rank in range(ds):
            self.stage = f"decode-{rank}: build"
            try:
                self.decode.append(self.build_rank("decode", rank))
            except DriverError:
                raise
            except Exception as e:
                return self.finish("error", f"decode-{rank}", "SGLang's classes refused the driver's build of this "
                                   f"case: NixlKVManager.__init__: {type(e).__name__}: {e}", traceback.format_exc())

        bootstrap_addr = f"{inproc.LOOPBACK}:{self.prefill[0].mgr.bootstrap_port}"
        common = S["common_conn"]
        nixl = S["nixl_conn"]
        kp = S["base_conn"].KVPoll
        prompt_len = int(spec["prompt_len"])
        page_size = spec["prefill"].get("page_size", spec["page_size"])
        num_pages = -(-prompt_len // page_size)
        p_pages = np.asarray(spec["prefill"]["request_pages"][:num_pages], dtype=np.int32)
        d_pages = np.asarray(spec["decode"]["request_pages"][:num_pages], dtype=np.int32)
        if len(p_pages) != num_pages or len(d_pages) != num_pages:
            raise DriverError(f"{num_pages} pages needed for {prompt_len} tokens, the case lists fewer")

        # Prefill: the request arrives; each rank's scheduler makes a sender.
        for r in self.prefill:
            self.stage = f"{r.name}: NixlKVSender"
            with topology(r.server_args, r.rank):
                r.sender = compat.make_sender(S, r.mgr, bootstrap_addr, room, r.rank)

        # Decode: each rank resolves the prefill's topology, registers and
        # sends the request's pages.
        mapping = {}
        for r in self.decode:
            self.stage = f"{r.name}: try_ensure_parallel_info"
            with topology(r.server_args, r.rank):
                try:
                    ok = r.mgr.try_ensure_parallel_info(bootstrap_addr)
                except Exception as e:
                    return self.sglang_raised(e, r.name, "try_ensure_parallel_info")
                if not ok:
                    return self.finish("error", r.name, "the driver cannot build this case: decode could not read "
                                       "the prefill's parallel info from the bootstrap table", None)
                info = r.mgr.prefill_info_table[bootstrap_addr]
                mapping[r.name] = {
                    "target_tp_rank": info.target_tp_rank,
                    "target_tp_ranks": list(info.target_tp_ranks),
                    "required_dst_info_num": info.required_dst_info_num,
                    "required_prefill_response_num": info.required_prefill_response_num,
                }
                self.stage = f"{r.name}: NixlKVReceiver"
                try:
                    r.receiver = nixl.NixlKVReceiver(r.mgr, bootstrap_addr, room)
                    r.receiver.init(prefill_dp_rank=0)
                    r.receiver.send_metadata(
                        kv_indices=d_pages, aux_index=int(spec["decode"].get("aux_index", 1)),
                        state_indices=self.state_indices("decode"),
                    )
                except Exception as e:
                    return self.sglang_raised(e, r.name, self.stage.split(": ")[1])
        self.result["rank_mapping"] = mapping

        # Prefill's bootstrap threads parse the frames; wait for every sender.
        self.stage = "bootstrap"
        if not self.wait(lambda: all(r.sender.poll() != kp.Bootstrapping for r in self.prefill)):
            return self.hung("bootstrap: a prefill rank's room never left Bootstrapping")
        for r in self.prefill:
            if r.sender.poll() == kp.Failed:
                return self.transfer_failed()

        # The forward pass is not run; the pool already holds the bytes.
        self.stage = "send"
        for r in self.prefill:
            with topology(r.server_args, r.rank):
                try:
                    r.sender.init(num_pages, int(spec["prefill"].get("aux_index", 0)))
                    # Before 0.5.13 the send path runs here, on the caller's thread (compat.py).
                    state = self.state_indices("prefill")
                    if state is None:
                        r.sender.send(p_pages)
                    else:
                        r.sender.send(p_pages, state_indices=state)
                except Exception as e:
                    return self.sglang_raised(e, r.name, "NixlKVSender.send")
        self.stage = "transfer"
        done = (kp.Success, kp.Failed)
        if not self.wait(lambda: all(r.sender.poll() in done for r in self.prefill)
                         and all(r.receiver.poll() in done for r in self.decode)):
            return self.hung("transfer: a room never reached Success or Failed")
        if any(r.sender.poll() == kp.Failed for r in self.prefill) or any(
                r.receiver.poll() == kp.Failed for r in self.decode):
            return self.transfer_failed()
        self.finish("done", None, None, None)

    def state_indices(self, role):
        """The request's state slot per state component (one, MAMBA), or None."""
        if self.spec["model"].get("state") is None:
            return None
        return [[int(self.spec[role].get("state_slot", 0 if role == "prefill" else 1))]]

    def wait(self, cond):
        """Until cond() or a SGLang thread died or the time-out; whether cond()."""
        deadline = time.time() + self.timeout_s
        while time.time() < deadline:
            if cond():
                return True
            if THREAD_ERRORS:
                return False
            time.sleep(0.002)
        return cond()

    # -- outcomes --
    def finish(self, status, side, message, trace):
        if "status" in self.result:
            return
        self.result.update(status=status, side=side, message=message, trace=trace)

    def sglang_raised(self, e, side, where):
        refused = isinstance(e, (RuntimeError, ValueError, NotImplementedError)) and not isinstance(
            e, fake_nixl.nixlError)
        self.finish("rejected" if refused else "crashed", side, f"{where}: {type(e).__name__}: {e}",
                    traceback.format_exc())

    def hung(self, what):
        if THREAD_ERRORS:
            err = THREAD_ERRORS[0]
            exc = err["exc"]
            refused = isinstance(exc, (RuntimeError, ValueError, NotImplementedError)) and not isinstance(
                exc, fake_nixl.nixlError)
            return self.finish("rejected" if refused else "crashed", self.side_of_thread(err["thread"]),
                               f"SGLang's thread {err['thread']} raised {err['type']}: {err['message']}",
                               err["trace"])
        return self.finish("hung", None, f"{what} within {self.timeout_s} s", None)

    def side_of_thread(self, thread_name):
        """The agent a dead SGLang thread belonged to: the agent of the first
        NIXL refusal when there is one, else the side its function runs on."""
        if self.fabric is not None and self.fabric.refusals:
            return self.fabric.refusals[0]["agent"]
        name = thread_name or ""
        if "decode_listener" in name or "Heartbeat" in name:
            return "decode"
        return "prefill"

    def transfer_failed(self):
        reasons = []
        for r in self.prefill + self.decode:
            for room, why in r.mgr.failure_records.items():
                reasons.append(f"{r.name} room {room}: {why}")
        side = "prefill" if any(r.mgr.failure_records for r in self.prefill) else "decode"
        self.finish("crashed", side, "; ".join(reasons) or "a room ended Failed without a reason", None)

    # -- the record --
    def collect(self):
        res = self.result
        res["sglang"] = getattr(S.get("sglang"), "__version__", None)
        res["torch"] = S["torch"].__version__ if S else None
        agents = {}
        for r in self.prefill + self.decode:
            entry = {"role": r.role, "rank": r.rank, "tp_size": r.engine["tp_size"]}
            if r.kv_args is not None:
                entry["regions"] = r.regions()
                if getattr(r.kv_args, "state_types", None):
                    entry["state_regions"] = hybrid.state_regions(r)
                entry["page_size"] = r.kv_args.page_size
                entry["gpu_id"] = r.kv_args.gpu_id
            if r.mgr is not None:
                entry["sglang_agent"] = r.mgr.agent.name
                entry["failures"] = {str(k): v for k, v in r.mgr.failure_records.items()}
            if r.sender is not None:
                entry["poll"] = _poll_name(r.sender.poll())
            if r.receiver is not None:
                entry["poll"] = _poll_name(r.receiver.poll())
            agents[r.name] = entry
        res["agents"] = agents
        f = self.fabric
        res["registrations"] = f.registrations if f else []
        res["dlists"] = f.dlists if f else []
        res["xfers"] = f.xfers if f else []
        res["refusals"] = f.refusals if f else []
        h = self.hub
        res["control"] = {
            "addresses": h.addresses if h else [],
            "messages": h.messages if h else [],
            "bootstrap_rows": h.routes if h else [],
            "http": h.http if h else [],
        }
        res["state_slices"] = list(hybrid.SLICE_CALLS)
        res["state_conv_source"] = dict(hybrid.CONV_SOURCE)
        res["thread_errors"] = [{k: v for k, v in e.items() if k != "exc"} for e in THREAD_ERRORS]

    def write_memory(self, directory):
        """`<agent>.r<i>.out`: every KV region's final bytes."""
        for r in self.prefill + self.decode:
            if r.kv_args is None:
                continue
            for i, view in enumerate(r.region_tensors()):
                view.numpy().tofile(os.path.join(directory, f"{r.name}.r{i}.out"))
            if getattr(r.kv_args, "state_types", None):
                for i, view in enumerate(hybrid.state_views(r, S["torch"])):
                    view.numpy().tofile(os.path.join(directory, f"{r.name}.s{i}.out"))

    def close(self):
        """End the case's SGLang threads (bootstrap, listener, heartbeat,
        transfer workers) and clear the published context."""
        if self.hub is not None:
            self.hub.stop_threads()
        for r in self.prefill + self.decode:
            mgr = r.mgr
            if mgr is None:
                continue
            if hasattr(mgr, "_heartbeat_shutdown"):
                mgr._heartbeat_shutdown.set()
            for q in getattr(mgr, "transfer_queues", []) or []:
                q.put(EndWorker())
        if S and S["runtime_context"] is not None:
            S["runtime_context"].reset_context()


def run_case(spec, timeout_s=20.0, keep=False):
    """Run one case; its result dict (and the Case when keep)."""
    case = Case(spec, timeout_s)
    try:
        result = case.run()
        if spec.get("dir") and spec.get("write_memory", True) and result.get("status") in ("done", "crashed",
                                                                                           "rejected"):
            case.write_memory(spec["dir"])
    finally:
        if not keep:
            case.close()
    return (result, case) if keep else result
