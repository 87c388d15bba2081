"""Tests of `requests: "scheduler"`: the place phase (`driver.py --place`)
and the run phase (`driver.py BATCH_DIR`) on vLLM's real scheduler and
connector, in this process.

Each test writes a batch as kvgeom would: batch.json without memory, the
place phase, then the blocks of place.json into the case and the memory
files (`<agent>.r<region>.in`: prefill's bytes a pattern that names rank,
region and offset, decode's a sentinel), then the run phase; the checks read
the `.out` files and result.json.

Run: `.vllm-venv/bin/python -m pytest vllm-driver/test_scheduler_requests.py`.
"""

import copy
import json
import os
import sys
import traceback

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import pytest  # noqa: E402

import driver  # noqa: E402
import scheduler_side  # noqa: E402  (imports vLLM)
from scheduler_side import _page_bytes as page_bytes  # noqa: E402
import test_scheduler_side as sched_tests  # noqa: E402

SENTINEL = 0xEE
# Blocks of each engine's pool in the tests' memory (the scheduler's pool is
# larger; its blocks fit in these).
POOL = 12


def pattern(side_rank, region, n):
    """Prefill's bytes: never the sentinel, different per rank and region."""
    seed = (side_rank * 7 + region * 13) % 50
    return bytes(1 + (seed + i * 3 + i // 251) % 200 for i in range(n))


def case(geometry, prompt_len, prefix_hit=0, mode="pull", requests="scheduler", name="c"):
    return {
        "id": name,
        "dir": name,
        "mode": mode,
        "requests": requests,
        "prompt_len": prompt_len,
        "prefix_hit": prefix_hit,
        "allocation": "mainline",
        "seed": 1,
        "geometry": geometry,
    }


def write_batch(root, cases):
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, "batch.json"), "w") as f:
        json.dump({"format": driver.BATCH_FORMAT, "case_timeout_s": 20.0, "cases": cases}, f)


def place(root, cases):
    write_batch(root, cases)
    assert driver.main(["driver.py", "--place", str(root)]) == 0
    out = {}
    for c in cases:
        path = os.path.join(root, c["dir"], "place.json")
        out[c["id"]] = json.load(open(path)) if os.path.exists(path) else None
    return out


def fill(root, spec, placed):
    """The case as kvgeom completes it from place.json: each engine's
    blocks and pool, and the memory files for them."""
    spec = copy.deepcopy(spec)
    g = spec["geometry"]
    spec["transferred_tokens"] = placed["tokens_to_transfer"]
    for side in ("prefill", "decode"):
        page = page_bytes(g, side)
        regions = g["model"]["layer_slots"]
        spec[side] = {
            "tp_size": g[side]["tp_size"],
            "num_logical_blocks": POOL,
            "page_bytes": page,
            "regions": regions,
            "region_bytes": POOL * page,
            "request_blocks": placed[side]["request_blocks"],
        }
        assert placed[side]["needed_blocks"] <= POOL
        for r in range(g[side]["tp_size"]):
            for i in range(regions):
                data = pattern(r + (0 if side == "prefill" else 100), i, POOL * page)
                if side == "decode":
                    data = bytes([SENTINEL]) * len(data)
                with open(os.path.join(root, spec["dir"], f"{side}-{r}.r{i}.in"), "wb") as f:
                    f.write(data)
    spec["decode"]["transfer_blocks"] = placed["decode"]["transfer_blocks"]
    spec["decode"]["computed_blocks"] = placed["decode"]["computed_blocks"]
    return spec


def run(root, specs):
    write_batch(root, specs)
    assert driver.main(["driver.py", str(root)]) == 0
    return [json.load(open(os.path.join(root, s["dir"], "result.json"))) for s in specs]


def out_bytes(root, spec, agent, region):
    return open(os.path.join(root, spec["dir"], f"{agent}.r{region}.out"), "rb").read()


def in_bytes(root, spec, agent, region):
    return open(os.path.join(root, spec["dir"], f"{agent}.r{region}.in"), "rb").read()


def attention_pages(spec, blocks):
    """Byte ranges of decode's attention pages of `blocks` in one region."""
    page = spec["decode"]["page_bytes"]
    return [(b * page, (b + 1) * page) for b in blocks]


def check_moved(root, spec, attention_group=0):
    """Decode's attention pages of the transfer blocks hold prefill's bytes
    (no sentinel byte left), every other attention page of the pool keeps
    the sentinel, in every region of every decode rank."""
    transfer = spec["decode"]["transfer_blocks"][attention_group]
    prefill_bytes = set()
    for r in range(spec["prefill"]["tp_size"]):
        for i in range(spec["prefill"]["regions"]):
            prefill_bytes |= set(in_bytes(root, spec, f"prefill-{r}", i))
    held = {b for g in spec["decode"]["request_blocks"] for b in g}
    for r in range(spec["decode"]["tp_size"]):
        for i in range(spec["decode"]["regions"]):
            out = out_bytes(root, spec, f"decode-{r}", i)
            for lo, hi in attention_pages(spec, transfer):
                assert SENTINEL not in out[lo:hi], f"decode-{r}.r{i} page {lo // (hi - lo)} keeps the sentinel"
                assert set(out[lo:hi]) <= prefill_bytes
            untouched = [b for b in range(POOL) if b not in held]
            for lo, hi in attention_pages(spec, untouched):
                assert set(out[lo:hi]) == {SENTINEL}, f"decode-{r}.r{i} block {lo // (hi - lo)} was written"


def one(tmp_path, spec, name="sched"):
    """Place then run one case; (placed, spec as run, result)."""
    root = tmp_path / name
    placed = place(root, [spec])[spec["id"]]
    assert placed["status"] == "placed", placed
    full = fill(root, spec, placed)
    (result,) = run(root, [full])
    assert result["status"] == "done", result.get("message")
    assert result["request_path"] == "scheduler"
    return placed, full, result, root


def direct_twin(tmp_path, full, name="direct"):
    """The same case, same blocks and memory, on the driver's direct path."""
    root = tmp_path / name
    os.makedirs(root / full["dir"], exist_ok=True)
    twin = dict(full, requests="direct")
    src = tmp_path / "sched" / full["dir"]
    for f in os.listdir(src):
        if f.endswith(".in"):
            (root / full["dir"] / f).write_bytes((src / f).read_bytes())
    (result,) = run(root, [twin])
    return result, root


@pytest.mark.parametrize("mode", ["pull", "push"])
@pytest.mark.parametrize("kind", ["gqa", "hybrid"])
def test_place_then_run_moves_prefills_bytes(tmp_path, mode, kind):
    geometry = sched_tests.attention_geometry() if kind == "gqa" else sched_tests.hybrid_geometry()
    n = 40
    spec = case(geometry, n, mode=mode)
    placed, full, result, root = one(tmp_path, spec)
    # Place: the blocks a fresh pool gives (README of test_scheduler_side).
    if kind == "gqa":
        assert placed["decode"]["transfer_blocks"] == [[1, 2, 3]]
        assert placed["prefill"]["request_blocks"] == [[1, 2, 3]]
        assert placed["tokens_to_transfer"] == 40
    else:
        # Hybrid: N - 1 = 39 tokens, ceil(39/16) = 3 attention blocks and one
        # mamba state slot.
        assert placed["tokens_to_transfer"] == 39
        assert placed["decode"]["transfer_blocks"] == [[1, 2, 3], [4]]
        assert placed["prefill"]["zeroed_at_alloc"] == [1, 2, 3]
    assert placed["prefill"]["pool_blocks"] > POOL
    assert placed["metadata"] == {"file": "scheduler_meta.pkl", "prefill_steps": placed["metadata"]["prefill_steps"], "decode_steps": 1}
    assert placed["kv_transfer_params"]["remote_engine_id"] == "prefill"
    assert os.path.exists(root / spec["dir"] / "scheduler_meta.pkl")
    # Run: decode's transfer blocks hold prefill's bytes, nothing else moved.
    check_moved(root, full)
    assert result["xfers"], "no transfer was made"
    # The same blocks on the direct path leave the same memory.
    twin, twin_root = direct_twin(tmp_path, full)
    assert twin["status"] == "done" and twin["request_path"] == "direct"
    for r in range(geometry["decode"]["tp_size"]):
        for i in range(full["decode"]["regions"]):
            assert out_bytes(root, full, f"decode-{r}", i) == out_bytes(twin_root, full, f"decode-{r}", i)


def test_prefix_hit_reads_only_the_blocks_past_the_hit(tmp_path):
    # N = 40, a 32-token hit on D (blocks 1, 2 of the earlier request): the
    # request holds [1, 2, 3] and only block 3 is read.
    spec = case(sched_tests.attention_geometry(), 40, 32)
    placed, full, result, root = one(tmp_path, spec)
    assert placed["decode"]["request_blocks"] == [[1, 2, 3]]
    assert placed["decode"]["transfer_blocks"] == [[3]]
    assert placed["decode"]["computed_blocks"] == [2]
    assert placed["tokens_to_transfer"] == 8
    page = full["decode"]["page_bytes"]
    for i in range(full["decode"]["regions"]):
        out = out_bytes(root, full, "decode-0", i)
        assert set(out[page : 3 * page]) == {SENTINEL}, "a prefix-hit block was read"
        assert SENTINEL not in out[3 * page : 4 * page]
    # Every local row decode read lies in block 3.
    local = [d for d in result["dlists"] if d["agent"] == "decode-0"]
    reads = [x for x in result["xfers"] if x["agent"] == "decode-0"]
    assert reads
    regions = result["regions"]["decode-0"]
    for x in reads:
        rows = next(d for d in local if d["handle"] == x["local"])["rows"]
        for k in x["local_ids"]:
            addr = rows[k][0]
            base, size = next((b, s) for b, s in regions if b <= addr < b + s)
            assert (addr - base) // page == 3


def test_pending_place_is_an_error_and_unreachable_is_reported(tmp_path):
    root = tmp_path / "b"
    spec = case(sched_tests.attention_geometry(), 40, 8, name="hit8")
    placed = place(root, [spec, case(sched_tests.attention_geometry(), 40, requests="direct", name="d")])
    assert placed["hit8"]["status"] == scheduler_side.NOT_REACHABLE
    assert "whole decode blocks" in placed["hit8"]["reason"]
    assert placed["d"] is None  # direct cases are not placed
    assert not os.path.exists(root / "hit8" / "scheduler_meta.pkl")


def test_blocks_other_than_the_schedulers_are_refused(tmp_path):
    spec = case(sched_tests.attention_geometry(), 40)
    root = tmp_path / "sched"
    placed = place(root, [spec])["c"]
    full = fill(root, spec, placed)
    full["decode"]["transfer_blocks"] = [[4, 5, 6]]
    (result,) = run(root, [full])
    assert result["status"] == "error"
    assert "not the scheduler's" in result["message"]


def _guard_read_blocks(monkeypatch):
    """`_read_blocks_for_req` raises unless vLLM's own start_load_kv is
    its caller; the calls that pass are counted."""
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_worker import NixlPullConnectorWorker

    real = NixlPullConnectorWorker._read_blocks_for_req
    calls = []

    def guarded(self, *args, **kwargs):
        stack = traceback.extract_stack()[:-1]
        callers = [(os.path.basename(f.filename), f.name) for f in stack]
        if callers[-1] != ("pull_worker.py", "start_load_kv"):
            raise AssertionError(f"_read_blocks_for_req called from {callers[-1]}")
        calls.append(callers)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(NixlPullConnectorWorker, "_read_blocks_for_req", guarded)
    return calls


def test_the_worker_is_driven_through_bind_and_start_load_kv(tmp_path, monkeypatch):
    calls = _guard_read_blocks(monkeypatch)
    spec = case(sched_tests.attention_geometry(), 40)
    placed, full, result, root = one(tmp_path, spec)
    assert len(calls) == 1
    # vLLM's connector facade called the worker: the model runner's path.
    assert ("connector.py", "start_load_kv") in calls[0]
    # The guard does catch a direct call: the direct path now fails, and
    # the guard being the harness's code, as a harness error.
    twin, _ = direct_twin(tmp_path, full)
    assert twin["status"] == "error" and "_read_blocks_for_req called from" in twin["message"], twin["message"]
    assert "vllm-driver/test_scheduler_requests.py:" in twin["message"], twin["message"]


@pytest.mark.parametrize("mode", ["pull", "push"])
def test_each_rank_gets_its_own_copy_bound_started_and_cleared(tmp_path, monkeypatch, mode):
    """The model runner's sequence on every rank that gets metadata: bind,
    start_load_kv (the connector hands its worker the bound metadata),
    clear, once per step; every rank and step its own object."""
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_worker import NixlPullConnectorWorker
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.push_worker import NixlPushConnectorWorker

    events = []  # (connector id, call, the metadata object: kept alive)
    connector_of = {}  # worker id -> its connector's id
    real_bind = KVConnectorBase_V1.bind_connector_metadata
    real_clear = KVConnectorBase_V1.clear_connector_metadata
    worker_cls = NixlPullConnectorWorker if mode == "pull" else NixlPushConnectorWorker
    real_start = worker_cls.start_load_kv

    def bind(self, meta):
        connector_of[id(self.connector_worker)] = id(self)
        events.append((id(self), "bind", meta))
        return real_bind(self, meta)

    def clear(self):
        events.append((id(self), "clear" if self.has_connector_metadata() else "clear-unbound", None))
        return real_clear(self)

    def start(self, meta):
        events.append((connector_of.get(id(self)), "start", meta))
        return real_start(self, meta)

    monkeypatch.setattr(KVConnectorBase_V1, "bind_connector_metadata", bind)
    monkeypatch.setattr(KVConnectorBase_V1, "clear_connector_metadata", clear)
    monkeypatch.setattr(worker_cls, "start_load_kv", start)
    spec = case(sched_tests.attention_geometry(), 40, mode=mode)
    placed, full, result, root = one(tmp_path, spec)
    by_rank = {}
    for conn, name, meta in events:
        assert conn is not None, "a worker was started outside its connector"
        by_rank.setdefault(conn, []).append((name, meta))
    steps = placed["metadata"]
    # Prefill's two ranks get prefill's steps, decode's one rank decode's.
    want = [steps["decode_steps"], steps["prefill_steps"], steps["prefill_steps"]]
    assert sorted(len(v) // 3 for v in by_rank.values()) == sorted(want)
    metas = []
    for calls in by_rank.values():
        assert len(calls) % 3 == 0
        for k in range(0, len(calls), 3):
            (b, bound), (st, started), (c, _) = calls[k : k + 3]
            assert (b, st, c) == ("bind", "start", "clear")
            assert started is bound  # the worker got the bound metadata
            metas.append(bound)
    assert len({id(m) for m in metas}) == len(metas), "two ranks or steps shared one metadata object"
    assert all(type(m).__name__ == "NixlConnectorMetadata" for m in metas)


@pytest.mark.parametrize("mode", ["pull", "push"])
def test_a_branch_field_reaches_the_worker_as_the_scheduler_set_it(tmp_path, monkeypatch, mode):
    """A connector developer's branch adds a ReqMeta field that its
    scheduler half fills: the worker sees the scheduler's value on the
    scheduler path, and the default on the direct path (which builds ReqMeta
    from the driver's fixed field list)."""
    import dataclasses

    from vllm.distributed.kv_transfer.kv_connector.v1.nixl import metadata
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.pull_worker import NixlPullConnectorWorker
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.push_worker import NixlPushConnectorWorker

    # The branch: ReqMeta grows `token_window` (default None) ...
    fields = [(f.name, f.type, f) for f in dataclasses.fields(metadata.ReqMeta)]
    Branch = dataclasses.make_dataclass(
        "ReqMeta",
        [(n, t, dataclasses.field(default=f.default, default_factory=f.default_factory)) for n, t, f in fields]
        + [("token_window", object, dataclasses.field(default=None))],
    )
    Branch.__module__ = metadata.__name__
    for module in ("metadata", "live_case", "push_case"):
        target = metadata if module == "metadata" else sys.modules[module]
        monkeypatch.setattr(target, "ReqMeta", Branch)
    # ... which its scheduler half fills when it builds decode's metadata.
    real_add = metadata.NixlConnectorMetadata.add_new_req_to_recv

    def add_new_req_to_recv(self, request_id, *args, **kwargs):
        real_add(self, request_id, *args, **kwargs)
        self.reqs_to_recv[request_id].token_window = (7, 40)

    monkeypatch.setattr(metadata.NixlConnectorMetadata, "add_new_req_to_recv", add_new_req_to_recv)
    seen = []
    if mode == "pull":
        # What the pull worker reads with.
        real_read = NixlPullConnectorWorker._read_blocks_for_req

        def read(self, req_id, meta):
            seen.append((type(meta).__name__, getattr(meta, "token_window", "absent")))
            return real_read(self, req_id, meta)

        monkeypatch.setattr(NixlPullConnectorWorker, "_read_blocks_for_req", read)
    else:
        # What decode's push worker is handed to wait for.
        real_start = NixlPushConnectorWorker.start_load_kv

        def start(self, meta):
            for req in meta.reqs_to_recv.values():
                seen.append((type(req).__name__, getattr(req, "token_window", "absent")))
            return real_start(self, meta)

        monkeypatch.setattr(NixlPushConnectorWorker, "start_load_kv", start)
    spec = case(sched_tests.attention_geometry(), 40, mode=mode)
    placed, full, result, root = one(tmp_path, spec)
    assert seen == [("ReqMeta", (7, 40))]
    seen.clear()
    twin, _ = direct_twin(tmp_path, full)
    assert twin["status"] == "done"
    assert seen == [("ReqMeta", None)]


def test_direct_cases_keep_todays_path(tmp_path, monkeypatch):
    """A batch with no `requests` field runs as before (and says so)."""
    spec = case(sched_tests.attention_geometry(), 40, name="plain")
    del spec["requests"]
    root = tmp_path / "sched"
    placed = place(root, [case(sched_tests.attention_geometry(), 40, name="plain")])["plain"]
    full = fill(root, dict(spec, requests="scheduler"), placed)
    del full["requests"]
    (result,) = run(root, [full])
    assert result["status"] == "done" and result["request_path"] == "direct"
