"""kvgeom's driver for vLLM's own NIXL connector workers.

Usage: python driver.py BATCH_DIR

Reads BATCH_DIR/batch.json (format kvgeom-vllm-batch/1), runs every case in
this one process and writes, per case, the final memory of every rank and
result.json (format kvgeom-vllm-result/1). See README.md for the protocol.
"""

import json
import os
import sys
import threading
import time
import traceback

RESULT_FORMAT = "kvgeom-vllm-result/1"
BATCH_FORMAT = "kvgeom-vllm-batch/1"
# Exit status when the installed vLLM lacks a class or method the driver needs.
MISSING_API_STATUS = 3


def agent(side, rank):
    return f"{side}-{rank}"


def write_result(case_dir, result):
    result["format"] = RESULT_FORMAT
    tmp = os.path.join(case_dir, "result.json.tmp")
    with open(tmp, "w") as f:
        json.dump(result, f)
    os.replace(tmp, os.path.join(case_dir, "result.json"))


def run_with_timeout(fn, limit):
    """Run fn() in a daemon thread; ('hung', None) when it outlives limit."""
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
        return "hung", None
    if "error" in box:
        return "error", box
    return "ok", box.get("value")


def main(argv):
    if len(argv) != 2:
        print("usage: driver.py BATCH_DIR", file=sys.stderr)
        return 2
    batch_dir = argv[1]
    with open(os.path.join(batch_dir, "batch.json")) as f:
        batch = json.load(f)
    if batch.get("format") != BATCH_FORMAT:
        print(f"driver: batch format {batch.get('format')!r} is not {BATCH_FORMAT}", file=sys.stderr)
        return 2
    started = time.time()
    import api_check

    lacking = api_check.missing()
    if lacking:
        print("driver: this vLLM lacks what the driver needs:", file=sys.stderr)
        for item in lacking:
            print(f"  - {item}", file=sys.stderr)
        return MISSING_API_STATUS
    import live_case  # imports vLLM (the slow part)

    live_case.warm()

    print(f"driver: vLLM imported in {time.time() - started:.1f} s", flush=True)
    limit = float(batch.get("case_timeout_s", 10.0))
    for spec in batch["cases"]:
        case_dir = os.path.join(batch_dir, spec["dir"])
        state, value = run_with_timeout(lambda: live_case.run(spec, case_dir), limit)
        if state == "ok":
            result = value
        elif state == "hung":
            # The case's thread is left behind (a daemon); its memory is not
            # returned, kvgeom reports the case hung.
            result = {
                "status": "hung",
                "message": f"vLLM's connector did not complete within {limit:g} s",
            }
        else:
            e = value["error"]
            result = {
                "status": "error",
                "message": f"{type(e).__name__}: {e}",
                "trace": value["trace"],
            }
        write_result(case_dir, result)
        print(f"driver: {spec['id']} {result['status']}", flush=True)
    return 0


if __name__ == "__main__":
    sys.dont_write_bytecode = True  # leave no __pycache__ in the project
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.exit(main(sys.argv))
