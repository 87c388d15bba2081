"""A pull case's v1 traces (`vllm-nixl-geometry-trace/1`, one JSON event a
line; docs/trace-format.md "Recording"): one file per decode rank, that
rank's view of the case. The local worker is the decode rank; the remote
agents are the prefill ranks it handshook with.

What goes in is what the driver saw of vLLM's real pull worker, in the
order vLLM did it: the memory it registered, every descriptor list it
prepared (vLLM's strided rows and the same expanded), the worker's own
geometry attributes after registration, each `add_remote_agent` with the
prefill rank's metadata, the request as handed to `_read_blocks_for_req`,
every transfer it made, the request after completion, and how the case
ended. `Recorder` is filled through the NIXL wrappers' hooks
(`Fabric.v1`) and by `live_case`; `write` puts one rank's events out.
"""

import json
import os

FORMAT = "vllm-nixl-geometry-trace/1"
LOCAL_TARGET = "NIXL_INIT_AGENT"

# The worker attributes a `local_geometry` event carries, by vLLM's names.
GEOMETRY_ATTRS = (
    "engine_id",
    "tp_rank",
    "world_size",
    "dcp_size",
    "pcp_size",
    "pp_size",
    "use_mla",
    "_has_mamba",
    "_is_csa_linear",
    "kv_cache_layout",
    "block_size",
    "num_blocks",
    "_logical_num_blocks",
    "_physical_blocks_per_logical_kv_block",
    "num_regions",
    "num_descs",
    "block_len_per_layer",
    "block_stride_per_layer",
    "region_num_blocks",
    "region_group_ids",
    "region_names",
    "region_mem_types",
    "_region_is_mla",
    "_transfer_layer_region_indices",
    "_transfer_layer_group_ids",
    "_ssm_region_indices",
    "_scratch_region_indices",
    "_ple_group_index",
    "_mamba_ssm_size",
    "nixl_memory_type",
    "use_host_buffer",
)


def plain(value):
    """A JSON value for vLLM's ints, tuples, numpy arrays, enums and dicts."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if hasattr(value, "tolist"):
        return plain(value.tolist())
    if isinstance(value, (list, tuple, set, frozenset)):
        return [plain(v) for v in value]
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, float):
        return value
    try:
        return int(value)
    except (TypeError, ValueError):
        return str(getattr(value, "name", value))


def strided_runs(descs):
    """vLLM's rows as `[addr, len, dev, stride, count]` runs (a plain row
    `[addr, len, dev]` is one run of one block)."""
    if isinstance(descs, tuple) and len(descs) == 2:
        descs = descs[0]
    runs = []
    for d in list(descs):
        d = [int(x) for x in list(d)[:5]]
        if len(d) >= 5:
            runs.append(d[:5])
        else:
            runs.append([d[0], d[1], d[2], d[1], 1])
    return runs


class Recorder:
    """Everything the v1 traces of one case need, in the order it happened.

    Events are kept per vLLM agent name (the decode ranks' are written);
    `agent_of` maps them to kvgeom's names at writing time."""

    def __init__(self):
        self.timeline = []  # (vLLM agent name, event)
        self.pending_reg = {}  # vLLM agent name -> rows of its last get_reg_descs
        self.nixl_cls = None  # the NIXL wrapper class vLLM's workers got
        self.duration_s = None  # the case's time in the driver

    def _add(self, agent, event):
        self.timeline.append((agent, event))

    # -- the NIXL wrappers' hooks --
    def reg_descs(self, agent, descs):
        self.pending_reg[agent] = [[int(r[0]), int(r[1]), int(r[2]), str(r[3]) if len(r) > 3 else ""] for r in descs]

    def registered(self, agent, backends):
        regions = self.pending_reg.pop(agent, [])
        self._add(agent, {"ev": "register_memory", "regions": regions, "backends": plain(list(backends or []))})

    def dlist(self, agent, handle, target, mem_type, descs, rows):
        self._add(
            agent,
            {
                "ev": "dlist",
                "handle": int(handle),
                "target": target,
                "mem_type": str(getattr(mem_type, "name", mem_type)),
                "strided": strided_runs(descs),
                "rows": [[int(a), int(n), int(d)] for a, n, d in rows],
            },
        )

    def xfer(self, agent, handle, record):
        notif = record.get("notif") or b""
        self._add(
            agent,
            {
                "ev": "xfer",
                "handle": int(handle),
                "op": record["op"],
                "local_handle": int(record["local"]),
                "local_ids": list(record["local_ids"]),
                "remote_handle": int(record["remote"]),
                "remote_ids": list(record["remote_ids"]),
                "notif_msg": notif.decode("utf-8", "replace") if isinstance(notif, bytes) else str(notif),
            },
        )

    # -- the driver's observations --
    def local_geometry(self, worker):
        self._add(worker.nixl_wrapper.name, {"ev": "local_geometry", **worker_geometry(worker)})

    def add_remote_agent(self, worker, sent, p_rank, p_tp, name, exception):
        """One handshake; `sent` is [`snapshot_metadata`] of the metadata
        prefill sent, taken before decode's `add_remote_agent` ran."""
        meta = dict(sent["fields"])
        handle = None
        for agent, event in reversed(self.timeline):
            if agent == worker.nixl_wrapper.name and event["ev"] == "dlist" and event["target"] == name:
                handle = event["handle"]
                break
        engine = sent["engine_id"]
        self._add(
            worker.nixl_wrapper.name,
            {
                "ev": "add_remote_agent",
                "args": {"remote_tp_rank": p_rank, "remote_tp_size": p_tp, "remote_dcp_size": 1},
                "remote_meta": meta,
                "result": name,
                "exception": exception,
                "dst_handle": handle,
                "dst_num_blocks": plain(worker.dst_num_blocks.get(engine)),
                "dst_region_num_blocks": plain(worker.dst_region_num_blocks.get(engine)),
            },
        )

    def request(self, worker, req_id, spec, req):
        self._add(
            worker.nixl_wrapper.name,
            {
                "ev": "request",
                "req_id": req_id,
                "prompt_len": spec["prompt_len"],
                "matched_tokens": spec["transferred_tokens"],
                **request_blocks(req),
            },
        )

    def request_done(self, worker, req_id, req, exception=None):
        self._add(
            worker.nixl_wrapper.name,
            {
                "ev": "request_done",
                "req_id": req_id,
                "exception": exception,
                "after_call": request_blocks(req),
                "geometry": worker_geometry(worker)["geometry"],
            },
        )


def snapshot_metadata(agent_meta):
    """The metadata prefill sent, as plain values: vLLM's decode rewrites it
    in place during the handshake (`_split_remote_blocks` views a remote
    block larger than decode's kernel block as several), and a v1 trace
    states what the remote rank reported."""
    return {
        "fields": {k: plain(v) for k, v in _fields(agent_meta).items() if k != "agent_metadata"},
        "engine_id": getattr(agent_meta, "engine_id", None),
    }


def _fields(struct):
    try:
        import msgspec

        return msgspec.structs.asdict(struct)
    except Exception:
        return dict(vars(struct))


def worker_geometry(worker):
    geometry = {name: plain(getattr(worker, name, None)) for name in GEOMETRY_ATTRS}
    bases = worker.kv_caches_base_addr.get(worker.engine_id, {})
    geometry["local_base_addrs"] = {str(k): plain(v) for k, v in bases.items()}
    geometry["src_blocks_data"] = plain(getattr(worker, "src_blocks_data", None))
    return {"worker_cls": type(worker).__name__, "exception": None, "geometry": geometry}


def request_blocks(req):
    remote = req.remote
    return {
        "local_block_ids": plain(req.local_block_ids),
        "local_physical_block_ids": plain(req.local_physical_block_ids),
        "local_num_computed_blocks": plain(req.local_num_computed_blocks),
        "remote_block_ids": plain(remote.block_ids if remote is not None else []),
        "remote_engine_id": remote.engine_id if remote is not None else None,
        "tp_size": int(req.tp_size),
        "dcp_size": int(req.dcp_size),
    }


def cached_blocks(spec):
    """Decode's prefix hit in logical blocks (the attention group's)."""
    groups = spec["geometry"]["model"]["groups"]
    computed = spec["decode"]["computed_blocks"]
    for kind, n in zip(groups, computed):
        if kind == "attention":
            return int(n)
    return int(max(computed, default=0))


def file_name(rank):
    return f"trace.v1.d{rank}.jsonl"


def write(spec, case_dir, result, recorder, alias, vllm_version):
    """One `trace.v1.d<rank>.jsonl` per decode rank in `case_dir`; the
    names written. `alias` maps vLLM's agent names to kvgeom's. A rank
    whose worker was never registered (vLLM's `register_kv_caches` raised
    on some rank first) gets no file: `trace.v1.skipped` says why."""
    geometry = spec["geometry"]
    decode, prefill = geometry["decode"], geometry["prefill"]
    p_tp, d_tp = prefill["tp_size"], decode["tp_size"]
    cached = cached_blocks(spec)
    kvgeom_of = {v: k for k, v in alias.items()}
    written = []
    skipped = []
    for d in range(d_tp):
        me = kvgeom_of.get(f"decode-{d}")
        if me is None:
            continue  # the rank was never built
        name = geometry.get("name", "case")
        mine = [dict(event) for agent, event in recorder.timeline if agent == me]
        # The prefill worker's blocks as its handshake metadata stated them
        # (kernel block, blocks per logical block: what vLLM derived from the
        # backend and the hybrid allocator's page).
        p_kernel, p_logical = reported_prefill_blocks(mine, prefill)
        params = {
            "p_tp": p_tp,
            "d_tp": d_tp,
            "num_tokens": spec["prompt_len"],
            "cached": cached,
            "alloc": spec.get("allocation", "mainline"),
            "d_rank": d,
            "prefix_hit": spec["prefix_hit"],
            "geometry": name,
            "seed": spec.get("seed", 0),
            "groups": list(geometry["model"]["groups"]),
        }
        events = [
            {
                "ev": "meta",
                "format": FORMAT,
                "nodeid": f"kvgeom-live/{name}::{spec['id']}-d{d}",
                "test": name,
                "params": params,
                "vllm": vllm_version,
            },
            {
                "ev": "case",
                "fn": "kvgeom_live_case",
                "args": {
                    "local_block": decode["logical_block"],
                    "kernel": decode["kernel_block"],
                    "remote_block": p_logical,
                    "num_tokens": spec["prompt_len"],
                    "tp_size": p_tp,
                    "remote_kernel": p_kernel,
                    "remote_dcp_size": 1,
                    "cached": cached,
                    "local_dcp_size": 1,
                    "local_rank": d,
                },
            },
            {
                "ev": "make_worker",
                "fn": "make_worker",
                "args": {
                    "local_block_size": decode["logical_block"],
                    "kernel_block_size": decode["kernel_block"],
                    "num_logical_blocks": spec["decode"]["num_logical_blocks"],
                    "tp_size": d_tp,
                    "tp_rank": d,
                    "dcp_size": 1,
                },
            },
            {"ev": "nixl_agent", "cls": recorder.nixl_cls},
        ]
        if not any(e["ev"] == "local_geometry" for e in mine):
            skipped.append(f"decode-{d} has no geometry: {result.get('message')}")
            continue
        bases = next(
            (
                e["geometry"]["local_base_addrs"].get(str(d))
                for e in mine
                if e["ev"] == "local_geometry" and e.get("geometry")
            ),
            None,
        )
        remote_added = False
        for event in mine:
            if event["ev"] == "register_memory" and bases:
                event = split_registration(event, bases)
            if event["ev"] == "dlist":
                t = event["target"]
                event["target"] = LOCAL_TARGET if t == "local" else alias.get(t, t)
            if event["ev"] == "add_remote_agent":
                if not remote_added:
                    events.append(
                        {
                            "ev": "make_remote_meta",
                            "fn": "remote_meta",
                            "args": {
                                "remote_block_size": p_logical,
                                "remote_kernel_block_size": p_kernel,
                                "remote_num_logical": spec["prefill"]["num_logical_blocks"],
                                "remote_ssm_sizes": event["remote_meta"].get("ssm_sizes") or [],
                            },
                        }
                    )
                    remote_added = True
                if event["result"] is not None:
                    event["result"] = alias.get(event["result"], event["result"])
            events.append(event)
        status = result.get("status")
        events.append(
            {
                "ev": "result",
                "outcome": "passed" if status == "done" else "failed",
                "duration_s": recorder.duration_s,
                "message": None if status == "done" else f"{status}: {result.get('message')}",
                "status": status,
            }
        )
        path = os.path.join(case_dir, file_name(d))
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            for seq, event in enumerate(events):
                line = {"seq": seq, "ev": event["ev"]}
                if event["ev"] not in ("meta", "case", "make_worker", "make_remote_meta", "result"):
                    line["agent"] = 0
                line.update({k: v for k, v in event.items() if k != "ev"})
                f.write(json.dumps(line) + "\n")
        os.replace(tmp, path)
        written.append(path)
    if skipped:
        write_skipped(case_dir, "; ".join(skipped))
    return written


def reported_prefill_blocks(events, prefill):
    """`(kernel block, logical block)` of the first prefill rank this decode
    rank handshook with, as its metadata reported them; the geometry's
    where no handshake got that far."""
    for event in events:
        if event["ev"] != "add_remote_agent":
            continue
        meta = event.get("remote_meta") or {}
        kernel, ppl = meta.get("block_size"), meta.get("physical_blocks_per_logical_kv_block")
        if isinstance(kernel, int) and isinstance(ppl, int) and kernel > 0 and ppl > 0:
            return kernel, kernel * ppl
    return prefill["kernel_block"], prefill["logical_block"]


def split_registration(event, bases):
    """The registered ranges as the worker's regions: vLLM registers one
    range per contiguous run of regions (the driver's layer slots overlay
    one backing allocation, as the hybrid allocator lays them out), and a
    v1 trace names one region per base address. Each region runs from its
    base to the next base or to the end of the range holding it; the
    ranges vLLM registered are kept in `registered`."""
    ranges = event["regions"]
    regions = []
    for base in bases:
        holder = next((r for r in ranges if r[0] <= base < r[0] + r[1]), None)
        if holder is None:
            return event  # a base outside every registered range: kept as registered
        end = holder[0] + holder[1]
        later = [b for b in bases if base < b < end]
        regions.append([base, (min(later) if later else end) - base, holder[2], holder[3]])
    return {**event, "regions": regions, "registered": ranges}


def write_skipped(case_dir, reason):
    """A push case (or one the writer cannot record): why it has no v1 trace."""
    with open(os.path.join(case_dir, "trace.v1.skipped"), "w") as f:
        f.write(reason + "\n")
