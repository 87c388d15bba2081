"""One case's v2 trace (docs/trace-format.md): the case as kvgeom specified
it, the driver's result for it, and, for a small case, every region's memory
before and after, in one JSON file, `trace.json` in the case's folder."""

import base64
import json
import os

TRACE_FORMAT = "kvgeom-vllm-trace/2"


def _memory(spec, case_dir):
    """Every region's initial and final bytes, base64, per agent and region;
    None when some final image is missing (the case did not finish)."""
    images = []
    for side in ("prefill", "decode"):
        engine = spec[side]
        for rank in range(engine["tp_size"]):
            agent = f"{side}-{rank}"
            for region in range(engine["regions"]):
                stem = os.path.join(case_dir, f"{agent}.r{region}")
                try:
                    with open(stem + ".in", "rb") as f:
                        before = f.read()
                    with open(stem + ".out", "rb") as f:
                        after = f.read()
                except FileNotFoundError:
                    return None
                images.append({
                    "agent": agent,
                    "region": region,
                    "before": base64.b64encode(before).decode("ascii"),
                    "after": base64.b64encode(after).decode("ascii"),
                })
    return {"encoding": "base64", "images": images}


def initial_bytes(spec):
    return sum(
        spec[side]["tp_size"] * spec[side]["regions"] * spec[side]["region_bytes"]
        for side in ("prefill", "decode")
    )


def write(spec, case_dir, result, memory_limit, vllm_version):
    case = {k: v for k, v in spec.items() if k != "dir"}
    trace = {
        "format": TRACE_FORMAT,
        "vllm_version": vllm_version,
        "case": case,
        "result": result,
    }
    if initial_bytes(spec) <= memory_limit:
        memory = _memory(spec, case_dir)
        if memory is not None:
            trace["memory"] = memory
    tmp = os.path.join(case_dir, "trace.json.tmp")
    with open(tmp, "w") as f:
        json.dump(trace, f)
    os.replace(tmp, os.path.join(case_dir, "trace.json"))
