#!/usr/bin/env python3
"""Compare kvgeom's scheduler model with what vLLM's own scheduler does.

Usage: scripts/scheduler-vs-model.py [--kvgeom BIN] [--python PY] [--json FILE] [--alloc A] [PATH...]

For every case of the geometry files or folders (default: geometries/*.toml)
that a sweep of them runs, in the mainline allocation (`with-last-token` is the allocation
of vLLM's tests, not of its scheduler: those cases are counted apart), this
runs vLLM's v1 scheduler with its KV cache manager and the NIXL connector's
scheduler half (vllm-driver/scheduler_side.py, one process, one scheduler
per engine reused across cases) and reads kvgeom's model of the same case
from `kvgeom explain`. It prints, per geometry and mode, the cases, those
whose prefix hit vLLM's scheduler cannot produce (`not reachable`), and
every quantity on which the two differ, with the first case that shows it:

- `M`: the prompt tokens prefill computed (vLLM: the request's
  `remote_num_tokens`; kvgeom: `transferred tokens M`);
- `to_transfer`: tokens decode loads (vLLM: `get_num_new_matched_tokens`;
  kvgeom: M less the prefix hit);
- `d_blocks`: decode's blocks per group, prefix-hit blocks included, vLLM's
  null placeholders not counted (kvgeom: `decode blocks per group`);
- `d_transfer`: decode's blocks per group the transfer writes (vLLM:
  ReqMeta's `local_block_ids`, or push's registration; kvgeom: `transfer
  writes`);
- `d_computed`: decode's prefix-hit blocks per group (vLLM: ReqMeta's
  `local_num_computed_blocks`; kvgeom: decode blocks less transfer blocks);
- `p_blocks`: prefill's blocks per group that decode receives (vLLM:
  `request_finished`'s `remote_block_ids`; kvgeom: `prefill blocks per
  group`);
- `d_zeroed`: decode's blocks per group zeroed at allocation (vLLM: the
  scheduler output's `new_block_ids_to_zero` of the remote request's step;
  kvgeom: the blocks its scenario zeroes, `request_shape`'s transfer
  blocks less `decode_unzeroed_blocks`, which explain does not print and
  this script computes as src/scheduler.rs does).

The sweep's case list comes from `kvgeom sweep FILE --format json` (kvgeom's
own connector: the same grid the live sweep runs). Nothing is changed in
kvgeom. Exit 0 when it ran (differences are the output, not a failure), 2
on bad input.
"""

import argparse
import concurrent.futures
import json
import os
import re
import subprocess
import sys
import tempfile
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def geometry_from_toml(path, name):
    """The geometry as kvgeom's batch.json states it (the file's fields,
    the file format's defaults filled in; `expect_rejection` is left out,
    the scheduler side does not read it); None for a file whose model kvgeom
    derives from an HF config."""
    with open(path, "rb") as f:
        doc = tomllib.load(f)

    def engine(e):
        return {
            "tp_size": e["tp_size"],
            "kernel_block": e["kernel_block"],
            "logical_block": e["logical_block"],
            "num_logical_blocks": e.get("num_logical_blocks"),
            "layout": e.get("layout", "NHD"),
            "host_buffer": e.get("host_buffer", False),
            "prefix_caching": e.get("prefix_caching", False),
            "block_padding_bytes": e.get("block_padding_bytes", 0),
        }

    model = doc["model"]
    if "groups" not in model:
        return None  # derived from an HF config by kvgeom (model.hf_config)
    attention = model.get("attention")
    if attention is not None:
        attention = dict(attention)
        if attention["kind"] == "mla":
            attention.pop("total_kv_heads", None)
    mamba = model.get("mamba")
    if mamba is not None:
        mamba = {**mamba, "n_groups": mamba.get("n_groups")}
    return {
        "name": name,
        "description": doc.get("description", ""),
        "model": {
            "attention": attention,
            "mamba": mamba,
            "groups": model["groups"],
            "layer_slots": model["layer_slots"],
            "state_slots": model.get("state_slots"),
        },
        "prefill": engine(doc["prefill"]),
        "decode": engine(doc["decode"]),
        "prompts": None,
        "expect_rejection": None,
    }


def sweep_cases(kvgeom, path):
    """The cases `kvgeom sweep PATH` runs (a folder: its files, and the
    sample of its subfolders' files, as the sweep chooses), by file."""
    with tempfile.TemporaryDirectory(prefix="kvgeom-sched-") as d:
        out = os.path.join(d, "sweep.json")
        subprocess.run([kvgeom, "sweep", path, "--format", "json", "--out", out], check=False, capture_output=True)
        if not os.path.exists(out):
            raise SystemExit(f"scheduler-vs-model: kvgeom sweep {path} wrote no report")
        with open(out) as f:
            cases = json.load(f)["cases"]
    by_file = {}
    for c in cases:
        by_file.setdefault(c["file"], []).append(c)
    return by_file


EXPLAIN_M = re.compile(r"^\s*transferred tokens M = (\d+)", re.M)
EXPLAIN_D = re.compile(r"^\s*decode blocks per group (\[.*\]) \(transfer writes (\[.*\])\)", re.M)
EXPLAIN_P = re.compile(r"^\s*prefill blocks per group (\[.*\]), pool", re.M)


def kvgeom_model(kvgeom, path, geometry, case):
    """kvgeom's model of the case: explain's numbers, and the alloc-time
    zeroing src/scheduler.rs decides (explain does not print it)."""
    args = [kvgeom, "explain", path, "--prompt", str(case["prompt_len"]), "--prefix-hit", str(case["prefix_hit"]),
            "--mode", case["mode"], "--alloc", case["allocation"]]
    text = subprocess.run(args, capture_output=True, text=True).stdout
    m, d, p = EXPLAIN_M.search(text), EXPLAIN_D.search(text), EXPLAIN_P.search(text)
    if not (m and d and p):
        return {"error": f"explain printed no request shape: {' '.join(args[1:])}"}
    m = int(m.group(1))
    d_blocks = [len(g) for g in json.loads(d.group(1))]
    d_transfer = json.loads(d.group(2))
    p_blocks = [len(g) for g in json.loads(p.group(1))]
    block = geometry["decode"]["logical_block"]
    hit_blocks = case["prefix_hit"] // block
    zeroed = []
    for kind, total, transfer in zip(geometry["model"]["groups"], d_blocks, d_transfer):
        if kind == "attention":
            unzeroed = max(min(-(-m // block), total) - hit_blocks, 0)
            zeroed.append(transfer - unzeroed)
        else:
            zeroed.append(0)  # mamba managers never zero
    return {
        "M": m,
        "to_transfer": m - case["prefix_hit"],
        "d_blocks": d_blocks,
        "d_transfer": d_transfer,
        "d_computed": [a - b for a, b in zip(d_blocks, d_transfer)],
        "p_blocks": p_blocks,
        "d_zeroed": zeroed,
    }


def vllm_numbers(result):
    d, p = result["decode"], result["prefill"]
    held = [[b for b in g if b != 0] for g in d["request_blocks"] or []]
    zero = set(d["zeroed_at_alloc"])
    out = {
        "M": p["kv_transfer_params"].get("remote_num_tokens"),
        "to_transfer": result["tokens_to_transfer"],
        "d_blocks": [len(g) for g in held],
        "d_transfer": [len(g) for g in d.get("transfer_blocks") or []],
        "p_blocks": [len(g) for g in p["kv_transfer_params"].get("remote_block_ids") or []],
        "d_zeroed": [sum(b in zero for b in g) for g in held],
        "d_null": sum(len(g) for g in d["request_blocks"] or []) - sum(len(g) for g in held),
    }
    if "computed_blocks" in d and d["computed_blocks"]:
        out["d_computed"] = list(d["computed_blocks"])
    return out


def direct_path_differences(result, model, mode):
    """The ReqMeta fields where the request vLLM's scheduler made differs
    from the one the driver's direct path builds from kvgeom's case:
    (field, what each holds)."""
    meta = result["decode"].get("req_meta")
    if meta is None:
        return [("req_meta", "none in build_connector_meta's metadata")]
    out = []
    direct_awaiting = mode == "push"  # live_case.py leaves the default, push_case.py sets True
    if meta["awaiting_kvs"] != direct_awaiting:
        out.append(("awaiting_kvs", f"scheduler {meta['awaiting_kvs']}, direct path {direct_awaiting}"))
    if list(meta["local_num_computed_blocks"]) != model["d_computed"]:
        out.append(
            (
                "local_num_computed_blocks",
                f"scheduler {meta['local_num_computed_blocks']}, direct path {model['d_computed']}",
            )
        )
    if meta["local_physical_block_ids"] != meta["local_block_ids"] and mode == "pull":
        out.append(("local_physical_block_ids", "scheduler's differ from its local_block_ids"))
    return out


def every_hit(geometry, listed):
    """The sweep's cases with every whole decode-block prefix hit short of
    the transferred tokens (M: N - 1 for a mamba hybrid, else N)."""
    block = geometry["decode"]["logical_block"]
    out = []
    for c in listed:
        if c["prefix_hit"]:
            continue
        n = c["prompt_len"]
        m = n - 1 if geometry["model"]["mamba"] is not None and n > 1 else n
        out.extend({**c, "prefix_hit": h} for h in range(0, m, block))
    return out


FIELDS = ["M", "to_transfer", "d_blocks", "d_transfer", "d_computed", "p_blocks", "d_zeroed"]


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kvgeom", default=os.path.join(ROOT, "target", "release", "kvgeom"))
    ap.add_argument("--python", default=os.path.join(ROOT, ".vllm-venv", "bin", "python"))
    ap.add_argument("--json", help="write every case's comparison here")
    ap.add_argument(
        "--alloc",
        default="mainline",
        choices=["mainline", "with-last-token"],
        help="the kvgeom allocation compared (with-last-token: a control, kvgeom's model of vLLM's tests "
        "against vLLM's scheduler, which must differ)",
    )
    ap.add_argument(
        "--hits",
        default="grid",
        choices=["grid", "all"],
        help="prefix hits: the sweep's (none, one block, the most whole blocks short of M) or, with "
        "prefix caching on decode, every whole-block hit short of M",
    )
    ap.add_argument("geometries", nargs="*")
    args = ap.parse_args(argv[1:])
    files = args.geometries or sorted(
        os.path.join("geometries", f) for f in os.listdir(os.path.join(ROOT, "geometries")) if f.endswith(".toml")
    )
    for path in (args.kvgeom, args.python):
        if not os.path.exists(path):
            print(f"scheduler-vs-model: {path} does not exist", file=sys.stderr)
            return 2
    cases = []  # (file, geometry, sweep case)
    apart = {}
    listed_by_file = {}
    for path in files:
        if not os.path.exists(path):
            print(f"scheduler-vs-model: {path}: no such file or folder", file=sys.stderr)
            return 2
        listed_by_file.update(sweep_cases(args.kvgeom, path))
    skipped = []
    for path, listed in listed_by_file.items():
        geometry = geometry_from_toml(path, listed[0]["geometry"])
        if geometry is None:
            skipped.append(path)
            continue
        geometry["prompts"] = sorted({c["prompt_len"] for c in listed})
        if args.hits == "all" and geometry["decode"]["prefix_caching"]:
            listed = every_hit(geometry, listed)
        seen = set()
        for c in listed:
            key = (c["prompt_len"], c["prefix_hit"], c["mode"], c["allocation"])
            if key in seen:
                continue
            seen.add(key)
            if c["allocation"] != args.alloc:
                apart[geometry["name"]] = apart.get(geometry["name"], 0) + 1
                continue
            cases.append((path, geometry, c))
    print(f"scheduler-vs-model: {len(cases)} {args.alloc} cases of {len(listed_by_file)} files", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="kvgeom-sched-") as d:
        batch = [
            {"id": f"c{i}", "geometry": g, "prompt_len": c["prompt_len"], "prefix_hit": c["prefix_hit"], "mode": c["mode"]}
            for i, (_, g, c) in enumerate(cases)
        ]
        with open(os.path.join(d, "batch.json"), "w") as f:
            json.dump({"format": "kvgeom-vllm-batch/1", "cases": batch}, f)
        out = os.path.join(d, "scheduler.json")
        run = subprocess.run(
            [args.python, os.path.join(ROOT, "vllm-driver", "scheduler_side.py"), d, "--out", out],
            capture_output=True,
            text=True,
        )
        if run.returncode != 0 or not os.path.exists(out):
            print(f"scheduler-vs-model: the scheduler side failed:\n{run.stderr[-4000:]}", file=sys.stderr)
            return 2
        with open(out) as f:
            ran = json.load(f)
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        models = list(pool.map(lambda t: kvgeom_model(args.kvgeom, *t), cases))
    rows = {}
    notes = {}
    detail = []
    for (path, g, c), result, model in zip(cases, ran["results"], models):
        key = (g["name"], c["mode"])
        row = rows.setdefault(key, {"cases": 0, "unreachable": 0, "errors": 0, "differ": 0, "fields": {}, "null": 0, "p_zeroed": 0, "reasons": {}})
        row["cases"] += 1
        name = f"N={c['prompt_len']} hit {c['prefix_hit']}"
        entry = {"file": path, "case": c, "vllm": result, "kvgeom": model}
        detail.append(entry)
        if result.get("status") == "error" or "error" in model:
            row["errors"] += 1
            row["reasons"].setdefault(result.get("message") or model.get("error"), name)
            continue
        if not result.get("reachable"):
            row["unreachable"] += 1
            row["reasons"].setdefault(result["reason"], name)
            continue
        ours = vllm_numbers(result)
        row["null"] += ours.pop("d_null") > 0
        row["p_zeroed"] += bool(result["prefill"]["zeroed_at_alloc"])
        differs = False
        for field in FIELDS:
            if field in ours and ours[field] != model[field]:
                differs = True
                f = row["fields"].setdefault(field, {"count": 0, "first": f"{name}: vLLM {ours[field]} kvgeom {model[field]}"})
                f["count"] += 1
        row["differ"] += differs
        entry["differs"] = differs
        for field, why in direct_path_differences(result, model, c["mode"]):
            note = notes.setdefault((c["mode"], field), {"count": 0, "first": f"{g['name']} {name}: {why}"})
            note["count"] += 1
    cost = ran["cost"]
    print(
        f"vLLM {ran['vllm']}; scheduler side: {cost['cases']} cases in {cost['total_s']:.2f} s, "
        f"{cost['scheduler_builds']} scheduler pairs built in {cost['build_s']:.2f} s; "
        f"per case with built schedulers: mean {cost['mean_reused_s'] * 1e3:.2f} ms, "
        f"max {cost['max_reused_s'] * 1e3:.2f} ms ({cost['reused_cases']} cases)"
    )
    print()
    print(f"{'geometry':<50} {'mode':<5} {'cases':>5} {'unreach':>7} {'errors':>6} {'differ':>6}  differences (cases: first case)")
    for (name, mode), row in sorted(rows.items()):
        fields = "; ".join(f"{k} ({v['count']}: {v['first']})" for k, v in row["fields"].items()) or "-"
        print(f"{name:<50} {mode:<5} {row['cases']:>5} {row['unreachable']:>7} {row['errors']:>6} {row['differ']:>6}  {fields}")
        for reason, first in row["reasons"].items():
            print(f"{'':<50}   not run or not reachable ({first}): {reason}")
        if row["null"]:
            print(f"{'':<50}   {row['null']} cases: decode's mamba groups also hold vLLM's null placeholder blocks")
        if row["p_zeroed"]:
            print(
                f"{'':<50}   {row['p_zeroed']} cases: vLLM zeroes prefill's new attention blocks at allocation "
                "(kvgeom's model zeroes nothing on prefill)"
            )
    if skipped:
        print()
        print("skipped (model derived from an HF config, not read by this script): " + ", ".join(skipped))
    if notes:
        print()
        print("ReqMeta fields vLLM's scheduler sets otherwise than the driver's direct path (live_case.py, push_case.py):")
        for (mode, field), note in sorted(notes.items()):
            print(f"  {mode} {field}: {note['count']} cases (first: {note['first']})")
    if apart:
        print()
        print(f"cases of the other allocation (not compared, --alloc {args.alloc}): "
              + ", ".join(f"{k} {v}" for k, v in sorted(apart.items())))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cost": ran["cost"], "vllm": ran["vllm"], "cases": detail}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
