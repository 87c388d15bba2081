"""The place phase of `--requests scheduler`: where vLLM's own scheduler puts
a case's request, before kvgeom writes any memory.

`python driver.py --place BATCH_DIR` runs every case of BATCH_DIR/batch.json
whose `requests` is `"scheduler"` through `scheduler_side.run_case` (vLLM's
schedulers of both engines, reused across the batch's cases of one geometry
and mode) and writes into the case's folder:

- `place.json` (format `kvgeom-vllm-place/1`, README.md "Scheduler
  requests"): the block ids vLLM's scheduler gave the request on each engine,
  each engine's pool, decode's transfer and prefix-hit blocks, the tokens to
  transfer, the blocks zeroed at allocation and prefill's
  kv_transfer_params;
- `scheduler_meta.pkl`: the connector metadata of the steps the workers
  must be handed, each pickled as vLLM's scheduler built it (`metas` below),
  for the run phase (`driver.py BATCH_DIR`) to unpickle and bind.

A case whose request vLLM's scheduler cannot place as asked is `status: "not
reachable by vLLM's scheduler"` with the reason (no metadata file); one the
scheduler or the driver's build of it refused is `status: "error"` with the
message. Cases with `requests` `"direct"` (or none) are left alone.
"""

import json
import os
import pickle
import time
import traceback

PLACE_FORMAT = "kvgeom-vllm-place/1"
META_FORMAT = "kvgeom-vllm-scheduler-meta/1"
PLACE_FILE = "place.json"
META_FILE = "scheduler_meta.pkl"
PLACED = "placed"


def wants_scheduler(spec):
    """Whether a case's requests come from vLLM's scheduler."""
    return spec.get("requests", "direct") == "scheduler"


def _needed(block_ids):
    """The smallest pool that holds every block id of `block_ids` (per group)."""
    return max([b for g in block_ids for b in g] + [0]) + 1


def place(spec, schedulers):
    """(place.json's content, the metadata file's content or None) of one case."""
    import scheduler_side

    metas = {}
    r = scheduler_side.run_case(spec, schedulers, metas)
    out = {"format": PLACE_FORMAT, "id": spec.get("id"), "mode": spec["mode"], "request_path": "scheduler"}
    if not r.get("reachable"):
        out.update(status=r["status"], reason=r["reason"])
        return out, None
    built = schedulers.last_built
    prefill_s, decode_s = schedulers.get(spec)  # the pair run_case used
    schedulers.last_built = built
    p, d = r["prefill"], r["decode"]
    out.update(
        status=PLACED,
        prompt_len=spec["prompt_len"],
        prefix_hit=spec.get("prefix_hit", 0),
        tokens_to_transfer=r["tokens_to_transfer"],
        kv_transfer_params=p["kv_transfer_params"],
        request_ids=metas["request_ids"],
        prefill={
            "request_blocks": p["request_blocks"],
            "pool_blocks": prefill_s.num_blocks,
            "needed_blocks": _needed(p["request_blocks"]),
            "computed_tokens": p["computed_tokens"],
            "zeroed_at_alloc": p["zeroed_at_alloc"],
        },
        decode={
            "request_blocks": d["request_blocks"],
            "transfer_blocks": d.get("transfer_blocks"),
            "computed_blocks": d.get("computed_blocks"),
            "pool_blocks": decode_s.num_blocks,
            "needed_blocks": _needed(d["request_blocks"] or []),
            "local_hit_tokens": d["local_hit_tokens"],
            "zeroed_at_alloc": d["zeroed_at_alloc"],
            **({"earlier_request": d["earlier_request"]} if "earlier_request" in d else {}),
        },
        metadata={
            "file": META_FILE,
            "prefill_steps": len(metas["prefill"]),
            "decode_steps": len(metas["decode"]),
        },
    )
    if d.get("transfer_blocks") is None:
        out.update(status="error", message="vLLM's decode scheduler handed its workers no request to receive")
        return out, None
    pkl = {
        "format": META_FORMAT,
        "mode": spec["mode"],
        "request_ids": metas["request_ids"],
        "prefill": metas["prefill"],
        "decode": metas["decode"],
    }
    return out, pkl


def _write(path, data, binary=False):
    tmp = path + ".tmp"
    with open(tmp, "wb" if binary else "w") as f:
        if binary:
            pickle.dump(data, f, protocol=pickle.HIGHEST_PROTOCOL)
        else:
            json.dump(data, f)
    os.replace(tmp, path)


def run_batch(batch_dir, cases, log=print):
    """The place phase over `cases`; returns the cost (seconds: the first
    scheduler case, the mean and maximum of those that found their
    schedulers built, the schedulers' build time)."""
    import scheduler_side

    schedulers = scheduler_side.Schedulers()
    times, reused = [], []
    for spec in cases:
        if not wants_scheduler(spec):
            continue
        case_dir = os.path.join(batch_dir, spec["dir"])
        os.makedirs(case_dir, exist_ok=True)
        for stale in (PLACE_FILE, META_FILE):
            if os.path.exists(os.path.join(case_dir, stale)):
                os.remove(os.path.join(case_dir, stale))
        schedulers.last_built = False
        started = time.perf_counter()
        try:
            out, pkl = place(spec, schedulers)
        except Exception as e:  # one case's failure is reported, the batch goes on
            out = {
                "format": PLACE_FORMAT,
                "id": spec.get("id"),
                "mode": spec.get("mode"),
                "request_path": "scheduler",
                "status": "error",
                "message": f"{type(e).__name__}: {e}",
                "trace": traceback.format_exc(),
            }
            pkl = None
        seconds = time.perf_counter() - started
        out["seconds"] = round(seconds, 6)
        times.append(seconds)
        if not schedulers.last_built:
            reused.append(seconds)
        if pkl is not None:
            _write(os.path.join(case_dir, META_FILE), pkl, binary=True)
        _write(os.path.join(case_dir, PLACE_FILE), out)
        log(f"driver: place {spec.get('id')} {out['status']}")
    return {
        "cases": len(times),
        "first_case_s": round(times[0], 6) if times else None,
        "reused_cases": len(reused),
        "mean_reused_s": round(sum(reused) / len(reused), 6) if reused else None,
        "max_reused_s": round(max(reused), 6) if reused else None,
        "scheduler_builds": schedulers.builds,
        "build_s": round(schedulers.build_s, 6),
        "total_s": round(sum(times), 6),
    }


def load_metas(case_dir, spec):
    """The run phase's view of a placed case: (place.json, the metadata
    file's content). Raises SchedulerRequestsError when the case was not
    placed or the batch's blocks are not the scheduler's."""
    place_path = os.path.join(case_dir, PLACE_FILE)
    if not os.path.exists(place_path):
        raise SchedulerRequestsError(f"{PLACE_FILE} is missing: run `driver.py --place` on the batch first")
    with open(place_path) as f:
        placed = json.load(f)
    if placed.get("status") != PLACED:
        raise SchedulerRequestsError(
            f"the place phase left this case {placed.get('status')}: "
            f"{placed.get('reason') or placed.get('message')}"
        )
    with open(os.path.join(case_dir, META_FILE), "rb") as f:
        pkl = pickle.load(f)
    if pkl.get("format") != META_FORMAT or pkl.get("mode") != spec["mode"]:
        raise SchedulerRequestsError(f"{META_FILE}: format {pkl.get('format')!r}, mode {pkl.get('mode')!r}")
    # kvgeom writes the memory for the scheduler's blocks: the batch must
    # name exactly those.
    mismatched = []
    for side, key in (("prefill", "request_blocks"), ("decode", "transfer_blocks")):
        want = placed[side][key]
        got = (spec.get(side) or {}).get(key)
        if got is not None and _lists(got) != _lists(want):
            mismatched.append(f"{side} {key} {got} (the scheduler's: {want})")
    for side in ("prefill", "decode"):
        pool = (spec.get(side) or {}).get("num_logical_blocks")
        if pool is not None and pool < placed[side]["needed_blocks"]:
            mismatched.append(f"{side} pool of {pool} blocks (the scheduler's blocks need {placed[side]['needed_blocks']})")
    if mismatched:
        raise SchedulerRequestsError("the batch's blocks are not the scheduler's: " + "; ".join(mismatched))
    return placed, pkl


def _lists(value):
    if isinstance(value, (list, tuple)):
        return [_lists(v) for v in value]
    return value


class SchedulerRequestsError(Exception):
    """A scheduler case the run phase cannot run as placed."""


def unpickle(step):
    """One step's connector metadata, as a worker process receives it: its
    own copy, unpickled from the bytes the scheduler's step gave."""
    return pickle.loads(step)
