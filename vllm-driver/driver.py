"""kvgeom's driver for vLLM's own NIXL connector workers.

Usage: python driver.py BATCH_DIR [--resume]
       python driver.py --place BATCH_DIR

`--place` is the first phase of a batch whose cases ask for vLLM's
scheduler (`requests: "scheduler"`): it runs each such case's scheduler side
and writes the case's place.json and scheduler_meta.pkl (place_case.py);
kvgeom then writes the memory for those blocks and runs the batch.

Reads BATCH_DIR/batch.json (format kvgeom-vllm-batch/1), runs its block
checks (vLLM's own block-size derivation, written to blocks.json) and every
case in this one process and writes, per case, the final memory of every
rank and result.json (format kvgeom-vllm-result/1), and, when the batch
asks for traces, trace.json (format kvgeom-vllm-trace/2). See README.md for
the protocol.

A case still running at the time-out leaves its thread behind, blocked in
vLLM's code with whatever state it holds; the driver then starts itself
afresh (`--resume`: the cases that have a result are skipped) so that no
later case shares a process with it.
"""

import json
import os
import sys
import threading
import time
import traceback

# vLLM reads the mamba conv state layout once per process (and caches it):
# the block checks would fix it before the cases set it. The connector moves
# conv state only in the DS layout (dim, state_len), as kvgeom lays it out.
os.environ["VLLM_SSM_CONV_STATE_LAYOUT"] = "DS"

RESULT_FORMAT = "kvgeom-vllm-result/1"
BATCH_FORMAT = "kvgeom-vllm-batch/1"
BLOCKS_FORMAT = "kvgeom-vllm-blocks/1"
# Exit status when the installed vLLM lacks a class or method the driver needs.
MISSING_API_STATUS = 3
# What moved the bytes of every case of this process: NIXL's kind
# ("stand-in" or "real") and the real one's version.
NIXL_RAN = {"kind": "stand-in", "version": None}


def agent(side, rank):
    return f"{side}-{rank}"


def write_result(case_dir, result, path="direct"):
    result["format"] = RESULT_FORMAT
    result["request_path"] = path
    result["nixl"] = NIXL_RAN["kind"]
    if NIXL_RAN["version"] is not None:
        result["nixl_version"] = NIXL_RAN["version"]
    tmp = os.path.join(case_dir, "result.json.tmp")
    with open(tmp, "w") as f:
        json.dump(result, f)
    os.replace(tmp, os.path.join(case_dir, "result.json"))


def run_with_timeout(fn, limit):
    """Run fn() in a daemon thread; ('hung', where it is blocked) when it
    outlives limit."""
    box = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as e:  # reported, never raised past the case
            box["error"] = e
            box["trace"] = traceback.format_exc()

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(limit)
    if t.is_alive():
        frame = sys._current_frames().get(t.ident)
        return "hung", "".join(traceback.format_stack(frame)) if frame is not None else ""
    if "error" in box:
        return "error", box
    return "ok", box.get("value")


def write_v1(spec, case_dir, result, state, vllm_version):
    """The case's v1 traces, one per decode rank (trace_v1.py): pull cases
    that ran to an end; otherwise a note saying why there are none."""
    import live_case
    import trace_v1

    recorded = live_case.V1_RECORDER[0]
    if spec["mode"] != "pull":
        trace_v1.write_skipped(case_dir, f"{spec['mode']} case: v1 traces record a pull worker's reads")
    elif state != "ok" or recorded is None or result.get("status") == "error":
        trace_v1.write_skipped(case_dir, f"the case ended {result.get('status')} before the driver recorded it")
    else:
        try:
            trace_v1.write(spec, case_dir, result, recorded[0], recorded[1], vllm_version)
        except Exception as e:  # a v1 writer fault costs the v1 trace only
            trace_v1.write_skipped(case_dir, f"the v1 writer failed: {type(e).__name__}: {e}")


def versions():
    """`X (torch Y)`: the vLLM and the torch this process runs."""
    import importlib.metadata as md

    def version(name):
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            return "not installed"

    return f"{version('vllm')} (torch {version('torch')})"


def loaded_code():
    """One line on the vLLM modules this process imported: whether each
    module's file matches the installed distribution's RECORD (the probe
    before the batch, provenance.py, compared the files it would load)."""
    import importlib.metadata

    import provenance

    try:
        dist = importlib.metadata.distribution("vllm")
    except importlib.metadata.PackageNotFoundError:
        return "loaded vLLM modules: no installed distribution to compare them with"
    loaded = sum(1 for n in sys.modules if n == "vllm" or n.startswith("vllm."))
    differ = provenance.loaded_modified(dist)
    if not differ:
        return f"loaded vLLM modules: {loaded}, each as vllm {dist.version}'s RECORD lists it"
    return f"loaded vLLM modules: {len(differ)} of {loaded} unlike vllm {dist.version}'s RECORD: {', '.join(differ[:5])}"


def _where(e):
    """The driver's own line an exception came from."""
    tb = traceback.extract_tb(e.__traceback__)
    here = os.path.dirname(os.path.abspath(__file__))
    mine = [f for f in tb if os.path.dirname(os.path.abspath(f.filename)) == here]
    f = (mine or tb)[-1] if (mine or tb) else None
    return f"{os.path.basename(f.filename)}:{f.lineno}" if f is not None else "driver"


def refuse(lacking):
    """Names each missing piece on stderr, one line each; the exit status."""
    print(f"driver: this vLLM ({versions()}) lacks what the driver needs:", file=sys.stderr)
    for item in lacking:
        print(f"  - {item}", file=sys.stderr)
    return MISSING_API_STATUS


def request_path(spec):
    """How a case's request reaches the workers: "scheduler" (vLLM's
    scheduler's metadata, bound as the model runner binds it) or "direct"
    (the driver's own ReqMeta, the default)."""
    return "scheduler" if spec.get("requests") == "scheduler" else "direct"


def main(argv):
    place = argv[1:2] == ["--place"]
    if place:
        argv = [argv[0]] + argv[2:]
    resume = argv[2:] == ["--resume"] and not place
    if len(argv) != 2 and not resume:
        print("usage: driver.py BATCH_DIR [--resume] | driver.py --place BATCH_DIR", file=sys.stderr)
        return 2
    batch_dir = argv[1]
    with open(os.path.join(batch_dir, "batch.json")) as f:
        batch = json.load(f)
    if batch.get("format") != BATCH_FORMAT:
        print(f"driver: batch format {batch.get('format')!r} is not {BATCH_FORMAT}", file=sys.stderr)
        return 2
    started = time.time()
    if place:
        # No worker runs and nothing moves: NIXL is not needed.
        scheduled = sorted(
            {c.get("mode") for c in batch.get("cases", []) if request_path(c) == "scheduler"} & {"pull", "push"}
        )
        return place_batch(batch_dir, batch, scheduled, started)
    nixl = batch.get("nixl", "stand-in")
    if nixl not in ("stand-in", "real"):
        print(f"driver: batch nixl {nixl!r} is neither 'stand-in' nor 'real'", file=sys.stderr)
        return 2
    if nixl == "real":
        # Before vLLM's import: a NIXL that cannot run fails the batch at once.
        import real_nixl

        try:
            NIXL_RAN.update(kind="real", version=real_nixl.probe())
        except real_nixl.NixlUnavailable as e:
            print(f"driver: real NIXL: {e}; {real_nixl.INSTALL_HINT}", file=sys.stderr)
            return real_nixl.UNAVAILABLE_STATUS
    import api_check

    modes = sorted({c.get("mode") for c in batch.get("cases", [])} & {"pull", "push"})
    scheduled = sorted(
        {c.get("mode") for c in batch.get("cases", []) if request_path(c) == "scheduler"} & {"pull", "push"}
    )
    if nixl == "real":
        import real_nixl

        wrapper_cls = real_nixl.RealNixlWrapper
    else:
        import fake_nixl

        wrapper_cls = fake_nixl.FakeNixlWrapper
    lacking = api_check.missing(modes, wrapper_cls) + api_check.missing_for_scheduler(scheduled, "run")
    if lacking:
        return refuse(lacking)
    checks = batch.get("block_checks") or []
    blocks_file = os.path.join(batch_dir, "blocks.json")
    if checks and not (resume and os.path.exists(blocks_file)):
        import block_sizes  # vLLM's own block-size derivation

        blocks = {"format": BLOCKS_FORMAT, "checks": block_sizes.run_checks(checks)}
        tmp = blocks_file + ".tmp"
        with open(tmp, "w") as f:
            json.dump(blocks, f)
        os.replace(tmp, blocks_file)
        print(f"driver: {len(checks)} block checks", flush=True)
    try:
        import live_case  # imports vLLM (the slow part)
        import push_case
    except (ImportError, AttributeError) as e:
        # Something api_check.py does not list: named, never a traceback.
        return refuse([f"{_where(e)}: {type(e).__name__}: {e} (importing the driver's case modules)"])

    live_case.use_nixl(NIXL_RAN["kind"])
    live_case.warm()
    live_case.RECORD_V1[0] = batch.get("trace_memory_limit") is not None

    what = f"real NIXL {NIXL_RAN['version']} (UCX, host memory)" if nixl == "real" else "the NIXL stand-in"
    print(
        f"driver: vLLM {versions()} imported in {time.time() - started:.1f} s; {what} moves the bytes",
        flush=True,
    )
    for item in api_check.optional():
        print(f"driver: absent, done without: {item}", flush=True)
    import compat

    print(f"driver: API profile: {compat.describe()}", flush=True)
    print(f"driver: {loaded_code()}", flush=True)
    limit = float(batch.get("case_timeout_s", 10.0))
    push_case.CASE_LIMIT_S = limit
    cases = batch["cases"]
    for i, spec in enumerate(cases):
        case_dir = os.path.join(batch_dir, spec["dir"])
        if resume and os.path.exists(os.path.join(case_dir, "result.json")):
            continue
        state, value = run_with_timeout(lambda: live_case.run(spec, case_dir), limit)
        if state == "ok":
            result = value
        elif state == "hung":
            # The case's thread is left behind (a daemon); its memory is not
            # returned, kvgeom reports the case hung.
            last = [l.strip() for l in value.strip().splitlines()[-2:]]
            result = {
                "status": "hung",
                "message": f"vLLM's connector did not complete within {limit:g} s"
                + (f"; blocked at {' '.join(last)}" if last else ""),
                "trace": value,
            }
        else:
            e = value["error"]
            result = {
                "status": "error",
                "message": f"{type(e).__name__}: {e}",
                "trace": value["trace"],
            }
        write_result(case_dir, result, request_path(spec))
        if batch.get("trace_memory_limit") is not None:
            import vllm
            import trace_file

            trace_file.write(spec, case_dir, result, batch["trace_memory_limit"], vllm.__version__)
            write_v1(spec, case_dir, result, state, vllm.__version__)
        print(f"driver: {spec['id']} {result['status']}", flush=True)
        if state == "hung" and i + 1 < len(cases):
            print("driver: a case's thread is left blocked; restarting for the rest", flush=True)
            sys.stderr.flush()
            os.execv(sys.executable, [sys.executable, os.path.abspath(__file__), batch_dir, "--resume"])
    return 0


def place_batch(batch_dir, batch, scheduled, started):
    """The place phase (`--place`): vLLM's scheduler side of every case with
    `requests: "scheduler"` (place_case.py)."""
    import api_check

    lacking = api_check.missing_for_scheduler(scheduled, "place")
    if lacking:
        return refuse(lacking)
    try:
        import live_case
        import place_case
        import scheduler_side  # noqa: F401  (imports vLLM: the slow part)
    except (ImportError, AttributeError) as e:
        return refuse([f"{_where(e)}: {type(e).__name__}: {e} (importing the driver's scheduler modules)"])
    live_case.warm()
    print(f"driver: vLLM {versions()} imported in {time.time() - started:.1f} s; placing requests", flush=True)
    cost = place_case.run_batch(batch_dir, batch.get("cases", []), lambda line: print(line, flush=True))
    print(f"driver: place cost {json.dumps(cost)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.dont_write_bytecode = True  # leave no __pycache__ in the project
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.exit(main(sys.argv))
