"""The scheduler side of a kvgeom case, run by vLLM's own scheduler.

One `EngineScheduler` per engine (prefill, decode) of a geometry and mode:
vLLM's v1 scheduler (the class its engine core runs: `AsyncScheduler` under
async scheduling, the default) with its KV cache manager (the hybrid
allocator with one KV-cache group per entry of the geometry's `groups`, the
prefix cache when the engine has prefix caching on) and the NIXL
connector's scheduler half (pull or push). It is built once and reused:
after each case every request is brought to its end, the prefix cache reset
and the free-block queue put back in block order, so a case sees the pool a
fresh scheduler would.

`run_case(spec)` takes a case as the driver receives it (batch.json's case:
`geometry`, `prompt_len`, `prefix_hit`, `mode`) and runs:

- on prefill, the request to completion (its prompt cut by the connector
  where it is, one token sampled) and `request_finished`, whose
  kv_transfer_params decode receives;
- on decode, when the case has a prefix hit, an earlier request made of the
  prompt's first `prefix_hit` tokens, run to completion so that its blocks
  stay in the prefix cache; then the remote request, through one
  `schedule()`: the local prefix-cache lookup, `get_num_new_matched_tokens`,
  the allocation, `update_state_after_alloc` and `build_connector_meta`.

and returns a JSON-able dict (see `run_case`). Nothing here is faked but the
model (an OPT config whose geometry comes from the KV-cache specs) and the
model runner's outputs (one sampled token per finished prefill).
"""

import contextlib
import copy
import os
import pickle
import sys
import time

os.environ.setdefault("VLLM_SSM_CONV_STATE_LAYOUT", "DS")

from vllm import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1 import kv_cache_interface as kvi  # noqa: E402
from vllm.v1.core.kv_cache_utils import (  # noqa: E402
    FreeKVCacheBlockQueue,
    get_request_block_hasher,
    init_none_hash,
    resolve_kv_cache_block_sizes,
)
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

import compat  # noqa: E402  (what differs between releases)
import live_case  # noqa: E402  (the driver's config and spec builders)

NOT_REACHABLE = "not reachable by vLLM's scheduler"
# Each engine's side channel (host, port), as its connector advertises it.
SIDE_CHANNELS = {"prefill": ("127.0.0.1", 5601), "decode": ("127.0.0.1", 5602)}
# Each engine's suffix of a request id (vLLM appends 8 hex digits per engine).
REQUEST_SUFFIX = {"prefill": "0000000a", "decode": "0000000d"}
# Token ids: a prompt counts up from FIRST_TOKEN; the model runner samples
# SAMPLED_TOKEN (not the end-of-sequence id: a request ends at max_tokens).
FIRST_TOKEN = 1000
SAMPLED_TOKEN = 7
# Steps a request may take before the scheduler side gives up on it.
MAX_STEPS = 64
# The model length the schedulers are configured for (any prompt fits).
MAX_MODEL_LEN = 1 << 20

_NONE_HASH = [False]


class SchedulerSideError(Exception):
    """vLLM's scheduler did something the scheduler side cannot go on from."""


def _jsonable(value):
    """vLLM's metadata values as JSON values (tuples as lists, sets sorted)."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        return sorted(_jsonable(v) for v in value)
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if hasattr(value, "__struct_fields__"):  # msgspec structs
        return {f: _jsonable(getattr(value, f)) for f in value.__struct_fields__}
    if hasattr(value, "__dataclass_fields__"):
        return {f: _jsonable(getattr(value, f)) for f in value.__dataclass_fields__}
    if hasattr(value, "__dict__"):
        # Public attributes only (a leading underscore marks vLLM's own state).
        return {k: _jsonable(v) for k, v in vars(value).items() if not k.startswith('_')}
    return repr(value)


def _connector_name(mode):
    return {"pull": "NixlConnector", "push": "NixlPushConnector"}[mode]


class EngineScheduler:
    """vLLM's scheduler of one engine of a geometry, reusable across cases."""

    def __init__(self, geometry, side, mode, num_blocks, page_bytes=None):
        if side not in ("prefill", "decode"):
            raise ValueError(f"side {side!r} is neither prefill nor decode")
        self.geometry = geometry
        self.side = side
        self.mode = mode
        engine = geometry[side]
        self.block_size = engine["logical_block"]
        self.prefix_caching = bool(engine.get("prefix_caching", False))
        self.has_mamba = geometry["model"].get("mamba") is not None
        config = live_case.build_vllm_config(geometry, engine, side, engine["tp_size"])
        config.kv_transfer_config.kv_connector = _connector_name(mode)
        # The engine ids the driver's workers are built with: decode's
        # ReqMeta names prefill's engine, and a worker finds its peer by it.
        config.kv_transfer_config.engine_id = side
        # One request at a time, its whole prompt in one step, whatever its
        # length (the OPT config's own limit is 2048).
        config.model_config.max_model_len = MAX_MODEL_LEN
        config.scheduler_config.max_num_batched_tokens = MAX_MODEL_LEN
        config.scheduler_config.max_num_scheduled_tokens = None
        config.cache_config.num_gpu_blocks = num_blocks
        self.kv_cache_config = self._kv_cache_config(num_blocks, page_bytes)
        self.num_blocks = num_blocks
        if not _NONE_HASH[0]:
            init_none_hash(sha256)
            _NONE_HASH[0] = True
        # The scheduler's and the hashes' block sizes, as vLLM's engine core
        # resolves them from the groups (their LCM, for a hybrid).
        scheduler_block, hash_block = resolve_kv_cache_block_sizes(self.kv_cache_config, config)
        compat.resolved_block_sizes(self.kv_cache_config, config, scheduler_block, hash_block)
        # The class the engine core runs (AsyncScheduler with async
        # scheduling, the default).
        scheduler_cls = config.scheduler_config.get_scheduler_cls()
        # Each engine's side channel (the address its kv_transfer_params and
        # push registrations advertise) is its own, as on two machines: the
        # connector reads it from the environment when it is built.
        with _side_channel(*SIDE_CHANNELS[side]):
            self.scheduler = scheduler_cls(
                vllm_config=config,
                kv_cache_config=self.kv_cache_config,
                log_stats=False,
                structured_output_manager=StructuredOutputManager(config),
                block_size=scheduler_block,
                hash_block_size=hash_block,
            )
        self.hasher = get_request_block_hasher(hash_block, sha256)
        self.calls = []
        # The connector metadata of every step, pickled as the step built it
        # (`capture`), while a case asks for it.
        self.metas = None
        self._watch_connector()
        conn = self.scheduler.connector.connector_scheduler
        # The heartbeat clock of a fresh connector: a reused one is put back
        # to it, so every case's first step carries the heartbeats a fresh
        # scheduler's does (optional: a vLLM without it has nothing to reset).
        self._fresh_heartbeat_time = getattr(conn, "_last_heartbeat_time", None)

    def _kv_cache_config(self, num_blocks, page_bytes):
        model = self.geometry["model"]
        engine = self.geometry[self.side]
        groups = []
        for g, kind in enumerate(model["groups"]):
            if kind == "attention":
                spec = live_case.attention_spec(model["attention"], engine)
            elif kind == "mamba":
                spec = live_case.mamba_spec(model["mamba"], engine, page_bytes or 0)
                # As vLLM's hybrid config sets it: with prefix caching the
                # states are kept at block boundaries ("align", the mamba
                # block is the engine's block); without it one running-state
                # slot whose block spans the whole model length ("none").
                if self.prefix_caching:
                    spec = _with(spec, mamba_cache_mode="align")
                else:
                    spec = _with(spec, mamba_cache_mode="none", block_size=MAX_MODEL_LEN)
            else:
                raise live_case.Unsupported(f"KV-cache group kind {kind!r}")
            names = [live_case.layer_name(i, g, kind) for i in range(model["layer_slots"])]
            groups.append(kvi.KVCacheGroupSpec(layer_names=names, kv_cache_spec=spec))
        return kvi.KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)

    def _watch_connector(self):
        """Record what the NIXL connector's scheduler half is asked and
        answers (the connector's facade forwards every call to it)."""
        conn = self.scheduler.connector.connector_scheduler
        calls = self.calls

        def wrap(name, record):
            real = getattr(conn, name)

            def watched(*args, **kwargs):
                out = real(*args, **kwargs)
                calls.append(record(out, *args, **kwargs))
                return out

            setattr(conn, name, watched)

        wrap(
            "get_num_new_matched_tokens",
            lambda out, request, num_computed_tokens: {
                "call": "get_num_new_matched_tokens",
                "request": request.request_id,
                "num_computed_tokens": num_computed_tokens,
                "matched": _jsonable(out),
            },
        )
        wrap(
            "update_state_after_alloc",
            lambda out, request, blocks, num_external_tokens: {
                "call": "update_state_after_alloc",
                "request": request.request_id,
                "block_ids": _jsonable(blocks.get_block_ids()),
                "hashed": [[b.block_hash is not None and not b.is_null for b in g] for g in blocks.blocks],
                "num_external_tokens": num_external_tokens,
            },
        )
        wrap(
            "request_finished",
            lambda out, request, block_ids, *a, **k: {
                "call": "request_finished",
                "request": request.request_id,
                "block_ids": _jsonable(block_ids),
                "num_computed_tokens": request.num_computed_tokens,
                "delay_free_blocks": bool(out[0]),
                "kv_transfer_params": _jsonable(out[1]),
            },
        )

    # --- requests -------------------------------------------------------

    def new_request(self, tokens, kv_transfer_params=None, name="req"):
        """A request of `tokens` that ends after one sampled token, hashed
        as the engine hashes it (for the prefix cache)."""
        params = SamplingParams(max_tokens=1)
        params.update_from_generation_config({}, SAMPLED_TOKEN + 1)
        req = Request(
            # The same ids in every case: a case's requests are all finished
            # before the next one starts. As the engines name one request
            # the router sent both: the same base id, each engine's own
            # 8-hex suffix (a push worker matches prefill's finished blocks
            # with decode's registration by the base id).
            request_id=f"{name}-{REQUEST_SUFFIX[self.side]}",
            prompt_token_ids=list(tokens),
            sampling_params=params,
            pooling_params=None,
            mm_features=None,
            block_hasher=self.hasher,
        )
        req.kv_transfer_params = kv_transfer_params
        return req

    def step(self, finished_recving=(), finished_sending=()):
        """One engine step: schedule, then the model runner's output."""
        out = self.scheduler.schedule()
        self.capture(out)
        return out, self.finish_step(out, finished_recving, finished_sending)

    def capture(self, out):
        """Keep the step's connector metadata, pickled at once (the
        connector hands its workers state it later changes in place, such as
        its heartbeat table), when a case asks for it (`metas` a list)."""
        if self.metas is not None:
            self.metas.append(pickle.dumps(out.kv_connector_metadata, protocol=pickle.HIGHEST_PROTOCOL))

    def finish_step(self, out, finished_recving=(), finished_sending=()):
        """The model runner's output for the step `out` scheduled: one
        sampled token for every request whose prompt is then computed (the
        scheduler advances a request's computed tokens when it schedules
        it), the transfers named finished."""
        ids = list(out.num_scheduled_tokens)
        sampled = []
        for rid in ids:
            req = self.scheduler.requests[rid]
            sampled.append([SAMPLED_TOKEN] if req.num_computed_tokens >= req.num_prompt_tokens else [])
        kv_out = None
        if finished_recving or finished_sending:
            kv_out = KVConnectorOutput(
                finished_recving=set(finished_recving) or None,
                finished_sending=set(finished_sending) or None,
            )
        mro = compat.model_runner_output(
            ModelRunnerOutput,
            ids,
            sampled_token_ids=sampled,
            kv_connector_output=kv_out,
        )
        return self.scheduler.update_from_output(out, mro)

    def run_to_completion(self, req):
        """Schedule `req` until it finishes (its prompt computed, one token
        sampled); the block ids vLLM zeroed at allocation in its steps."""
        self.scheduler.add_request(req)
        zeroed = []
        for _ in range(MAX_STEPS):
            out, _ = self.step()
            zeroed.extend(out.new_block_ids_to_zero or ())
            if req.is_finished():
                return zeroed
        raise SchedulerSideError(f"{req.request_id} did not finish in {MAX_STEPS} steps")

    def call(self, name, request_id):
        """The last recorded call `name` for `request_id` (None if none)."""
        for c in reversed(self.calls):
            if c["call"] == name and c["request"] == request_id:
                return c
        return None

    def reset(self):
        """Bring every request to its end as the engine would (a load
        reported received, then the request's last token computed; a
        prefill's blocks reported sent), release every block, empty the
        prefix cache and put the free queue back in block order."""
        s = self.scheduler
        pool = s.kv_cache_manager.block_pool
        reported = set()  # each transfer is reported finished once
        for _ in range(MAX_STEPS):
            if not s.requests:
                break
            live = [r for r in s.requests.values() if r.request_id not in reported]
            recving = [r.request_id for r in live if r.status == RequestStatus.WAITING_FOR_REMOTE_KVS]
            sending = [r.request_id for r in live if r.is_finished()]
            reported.update(recving, sending)
            self.step(finished_recving=recving, finished_sending=sending)
        if s.requests:
            raise SchedulerSideError(f"requests left after reset: {sorted(s.requests)}")
        if pool.get_num_free_blocks() != self.num_blocks - 1:
            # Blocks freed while a step was in flight (async scheduling)
            # return once a step with scheduled tokens completes.
            self.run_to_completion(self.new_request([SAMPLED_TOKEN], None, "drain"))
        if pool.get_num_free_blocks() != self.num_blocks - 1:
            raise SchedulerSideError(
                f"{self.num_blocks - 1 - pool.get_num_free_blocks()} blocks still held after reset"
            )
        if not s.reset_prefix_cache():
            raise SchedulerSideError("vLLM refused to reset the prefix cache")
        pool.free_block_queue = FreeKVCacheBlockQueue([b for b in pool.blocks if not b.is_null])
        self.calls.clear()
        self.metas = None
        conn = s.connector.connector_scheduler
        if self._fresh_heartbeat_time is not None:
            conn._last_heartbeat_time = self._fresh_heartbeat_time


@contextlib.contextmanager
def _side_channel(host, port):
    """vLLM's side-channel environment set to (host, port) for a while."""
    names = {"VLLM_NIXL_SIDE_CHANNEL_HOST": host, "VLLM_NIXL_SIDE_CHANNEL_PORT": str(port)}
    saved = {k: os.environ.get(k) for k in names}
    os.environ.update(names)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _with(spec, **changes):
    import dataclasses

    return dataclasses.replace(spec, **changes)


def prompt_tokens(n):
    """The case's prompt: n distinct token ids."""
    return list(range(FIRST_TOKEN, FIRST_TOKEN + n))


def _cdiv(a, b):
    return -(-a // b)


# The smallest prompt a pool is sized for (a pool is rebuilt, twice as
# large, only for a longer one; block ids do not depend on the pool's size).
MIN_POOL_TOKENS = 4096


def pool_blocks(geometry, prompt_len):
    """Blocks enough for two requests of `prompt_len` tokens on either
    engine (the earlier request and the remote one), every group, plus the
    null block."""
    groups = len(geometry["model"]["groups"])
    block = min(geometry["prefill"]["logical_block"], geometry["decode"]["logical_block"])
    return 2 * groups * (_cdiv(prompt_len, block) + 2) + 1


class Schedulers:
    """One scheduler per engine per geometry and mode, reused across cases;
    rebuilt (larger) only when a case needs more blocks than its pool."""

    def __init__(self):
        self._built = {}
        self.builds = 0
        self.build_s = 0.0
        self.last_built = False

    def get(self, spec):
        geometry = spec["geometry"]
        key = (json_key(geometry), spec["mode"])
        longest = max([spec["prompt_len"]] + list(geometry.get("prompts") or []))
        pair = self._built.get(key)
        if pair is None or pair[0].num_blocks < pool_blocks(geometry, longest):
            tokens = MIN_POOL_TOKENS
            while tokens < longest:
                tokens *= 2
            need = pool_blocks(geometry, tokens)
            page = {side: (spec.get(side) or {}).get("page_bytes") for side in ("prefill", "decode")}
            started = time.perf_counter()
            pair = tuple(
                EngineScheduler(geometry, side, spec["mode"], need, page[side] or _page_bytes(geometry, side))
                for side in ("prefill", "decode")
            )
            self._built[key] = pair
            self.builds += 1
            self.build_s += time.perf_counter() - started
            self.last_built = True
        else:
            self.last_built = False
        return pair


def json_key(value):
    import json

    return json.dumps(value, sort_keys=True)


def _page_bytes(geometry, side):
    """A mamba page of one layer slot when the case does not state it: the
    largest of the attention block and the mamba state, as the unified page
    of the hybrid allocator."""
    model = geometry["model"]
    engine = geometry[side]
    tp = engine["tp_size"]
    page = 0
    attn = model.get("attention")
    if attn:
        heads = 1 if attn["kind"] == "mla" else max(1, attn["total_kv_heads"] // tp)
        kv = 1 if attn["kind"] == "mla" else 2
        page = kv * heads * attn["head_size"] * attn["dtype_bytes"] * engine["logical_block"]
    mamba = model.get("mamba")
    if mamba:
        conv = sum(live_case.rank_channels(mamba, j, tp) for j in range(len(mamba["conv_dims"])))
        state = conv * mamba["conv_rows"] * mamba["conv_dtype_bytes"] + mamba["ssm_state_bytes"] // tp
        page = max(page, state)
    return page


_SCHEDULERS = Schedulers()


def _groups_len(block_ids):
    return [len(g) for g in block_ids]


def _held(block_ids):
    """Per group, the blocks that are not vLLM's null block (id 0)."""
    return [[b for b in g if b != 0] for g in block_ids]


def _unreachable(reason, **what_ran):
    return {"request_path": "scheduler", "reachable": False, "status": NOT_REACHABLE, "reason": reason, **what_ran}


def run_case(spec, schedulers=None, metas=None):
    """vLLM's scheduler on one case (`spec`: a case of batch.json: its
    `geometry`, `prompt_len`, `prefix_hit` and `mode`).

    Returns `{"request_path": "scheduler", "reachable": True, "prefill": P,
    "decode": D, "tokens_to_transfer": T, "seconds": S}` where

    - P: `request_blocks` (per group, the block ids the request held when it
      finished, vLLM's null block 0 included), `kv_transfer_params` (what
      `request_finished` returned: what decode receives), `computed_tokens`
      (the prompt tokens prefill computed, after the connector cut the
      prompt), `zeroed_at_alloc` (blocks vLLM zeroes when it allocates
      them), `next_meta` (the connector metadata of prefill's next step);
    - D: `request_blocks` (per group, as P's), `transfer_blocks` and
      `computed_blocks` (ReqMeta's `local_block_ids` and
      `local_num_computed_blocks`), `local_hit_tokens` (the prefix-cache hit
      vLLM found), `matched_tokens` and `load_async`
      (`get_num_new_matched_tokens`), `num_external_tokens`
      (`update_state_after_alloc`), `req_meta` (the request's ReqMeta in
      `build_connector_meta`'s metadata, pull), `push_registration` (push),
      `zeroed_at_alloc` (of the remote request's step), `earlier_request`
      (its tokens and blocks; absent without a prefix hit);
    - T: the tokens decode loads (`matched_tokens`).

    With `metas` (a dict), the connector metadata the workers get is kept
    in it, each step's pickled as the scheduler built it: `prefill` (every
    step of prefill's request, from the one that schedules it to the one
    after it finished, whose metadata hands the worker its finished blocks)
    and `decode` (the step that schedules the remote request:
    `build_connector_meta`'s `reqs_to_recv`, and in push the
    registration), and `request_ids` (each engine's id of the request).

    A prefix hit vLLM's scheduler cannot produce gives `{"request_path":
    "scheduler", "reachable": False, "status": "not reachable by vLLM's
    scheduler", "reason": ...}` (with what vLLM did, when it ran).
    """
    schedulers = schedulers or _SCHEDULERS
    started = time.perf_counter()
    geometry = spec["geometry"]
    n = spec["prompt_len"]
    hit = spec.get("prefix_hit", 0)
    decode_engine = geometry["decode"]
    block = decode_engine["logical_block"]
    if spec["mode"] not in ("pull", "push"):
        raise ValueError(f"mode {spec['mode']!r} is neither pull nor push")
    if hit and not decode_engine.get("prefix_caching"):
        return _unreachable(f"a prefix hit of {hit} tokens needs prefix caching on decode, which is off")
    if hit % block:
        return _unreachable(f"a prefix hit of {hit} tokens is not whole decode blocks of {block}")
    prefill, decode = schedulers.get(spec)
    try:
        return _run(spec, prefill, decode, n, hit, started, metas)
    finally:
        prefill.reset()
        decode.reset()


def _run(spec, prefill, decode, n, hit, started, metas=None):
    tokens = prompt_tokens(n)
    # Prefill: the request to completion; request_finished's parameters go
    # to decode as the router would pass them.
    p_req = prefill.new_request(tokens, {"do_remote_decode": True, "do_remote_prefill": False}, "req")
    if metas is not None:
        prefill.metas = metas["prefill"] = []
    p_zeroed = prefill.run_to_completion(p_req)
    finished = prefill.call("request_finished", p_req.request_id)
    if finished is None or not finished["kv_transfer_params"]:
        raise SchedulerSideError(f"prefill's request_finished gave no kv_transfer_params: {finished}")
    p_next, _ = prefill.step()
    prefill.metas = None
    p_out = {
        "request_blocks": finished["block_ids"],
        "kv_transfer_params": finished["kv_transfer_params"],
        "computed_tokens": finished["num_computed_tokens"],
        "delay_free_blocks": finished["delay_free_blocks"],
        "zeroed_at_alloc": sorted(set(p_zeroed)),
        "next_meta": _jsonable(p_next.kv_connector_metadata),
    }
    d_out = {}
    if hit:
        early = decode.new_request(tokens[:hit], None, "earlier")
        decode.run_to_completion(early)
        alloc = decode.call("update_state_after_alloc", early.request_id)
        d_out["earlier_request"] = {"tokens": hit, "blocks": alloc["block_ids"] if alloc else None}
    params = copy.deepcopy(finished["kv_transfer_params"])
    d_req = decode.new_request(tokens, params, "req")
    decode.scheduler.add_request(d_req)
    out = decode.scheduler.schedule()
    if metas is not None:
        decode.metas = metas["decode"] = []
        decode.capture(out)
        decode.metas = None
        metas["request_ids"] = {"prefill": p_req.request_id, "decode": d_req.request_id}
    decode.finish_step(out)
    matched = decode.call("get_num_new_matched_tokens", d_req.request_id)
    alloc = decode.call("update_state_after_alloc", d_req.request_id)
    meta = out.kv_connector_metadata
    d_out.update(
        local_hit_tokens=matched["num_computed_tokens"] if matched else None,
        matched_tokens=matched["matched"][0] if matched else None,
        load_async=bool(matched["matched"][1]) if matched else None,
        num_external_tokens=alloc["num_external_tokens"] if alloc else None,
        request_blocks=_jsonable(decode.scheduler.kv_cache_manager.get_block_ids(d_req.request_id))
        if d_req.request_id in decode.scheduler.requests
        else None,
        status=d_req.status.name,
        computed_tokens=d_req.num_computed_tokens,
        zeroed_at_alloc=sorted(set(out.new_block_ids_to_zero or ())),
    )
    recv = getattr(meta, "reqs_to_recv", {}).get(d_req.request_id)
    if recv is not None:
        d_out["req_meta"] = _jsonable(recv)
        d_out["transfer_blocks"] = _jsonable(recv.local_block_ids)
        d_out["computed_blocks"] = _jsonable(recv.local_num_computed_blocks)
    registration = (getattr(meta, "push_registrations", None) or {}).get(d_req.request_id)
    if registration is not None:
        d_out["push_registration"] = _jsonable(registration)
        d_out["transfer_blocks"] = _jsonable(registration["local_block_ids"])
    result = {
        "request_path": "scheduler",
        "reachable": True,
        "prefill": p_out,
        "decode": d_out,
        "tokens_to_transfer": d_out["matched_tokens"],
    }
    if d_out["local_hit_tokens"] != hit:
        result = _unreachable(
            f"the earlier request of {hit} tokens gave a prefix hit of {d_out['local_hit_tokens']} tokens"
            + (" (a hybrid hits only where every group, the mamba states included, has the block cached)"
               if spec["geometry"]["model"].get("mamba") else ""),
            prefill=p_out,
            decode=d_out,
        )
    result["seconds"] = round(time.perf_counter() - started, 6)
    return result


RESULT_FORMAT = "kvgeom-vllm-scheduler/1"


def run_batch(cases, schedulers=None):
    """Every case through `run_case`, each result with its case `id`; a case
    vLLM's scheduler or the driver's build of it refused is `status: error`
    with the message. Returns (results, cost): cost is the time of the
    first case and of the rest, and of the cases that found their schedulers
    built (one scheduler per engine per geometry and mode, reused) apart
    from the time spent building them."""
    import traceback

    schedulers = schedulers or Schedulers()
    results = []
    times = []
    reused = []  # cases that found their schedulers built
    for spec in cases:
        schedulers.last_built = False
        started = time.perf_counter()
        try:
            result = run_case(spec, schedulers)
        except Exception as e:  # one case's failure is reported, the batch goes on
            result = {
                "request_path": "scheduler",
                "status": "error",
                "message": f"{type(e).__name__}: {e}",
                "trace": traceback.format_exc(),
            }
        times.append(time.perf_counter() - started)
        if not schedulers.last_built:
            reused.append(times[-1])
        result["id"] = spec.get("id")
        results.append(result)
    rest = times[1:]
    cost = {
        "cases": len(times),
        "first_case_s": round(times[0], 6) if times else None,
        "mean_after_first_s": round(sum(rest) / len(rest), 6) if rest else None,
        "max_after_first_s": round(max(rest), 6) if rest else None,
        "scheduler_builds": schedulers.builds,
        "build_s": round(schedulers.build_s, 6),
        "reused_cases": len(reused),
        "mean_reused_s": round(sum(reused) / len(reused), 6) if reused else None,
        "max_reused_s": round(max(reused), 6) if reused else None,
        "total_s": round(sum(times), 6),
    }
    return results, cost


def main(argv):
    """`scheduler_side.py BATCH_DIR [--out FILE]`: every case of
    BATCH_DIR/batch.json; each result goes to the case's folder as
    `scheduler.json` when the case names one (`dir`) that exists, and all of
    them with the cost to FILE (format kvgeom-vllm-scheduler/1)."""
    import json

    args = argv[1:]
    out = None
    if len(args) == 3 and args[1] == "--out":
        out = args[2]
        args = args[:1]
    if len(args) != 1:
        print("usage: scheduler_side.py BATCH_DIR [--out FILE]", file=sys.stderr)
        return 2
    batch_dir = args[0]
    with open(os.path.join(batch_dir, "batch.json")) as f:
        batch = json.load(f)
    results, cost = run_batch(batch.get("cases", []))
    for spec, result in zip(batch.get("cases", []), results):
        case_dir = os.path.join(batch_dir, spec["dir"]) if spec.get("dir") else None
        if case_dir and os.path.isdir(case_dir):
            with open(os.path.join(case_dir, "scheduler.json"), "w") as f:
                json.dump({"format": RESULT_FORMAT, **result}, f)
    if out:
        import vllm

        with open(out, "w") as f:
            json.dump({"format": RESULT_FORMAT, "vllm": vllm.__version__, "cost": cost, "results": results}, f)
    print(f"scheduler side: {cost}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.dont_write_bytecode = True  # leave no __pycache__ in the project
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.exit(main(sys.argv))
