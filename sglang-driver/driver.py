"""Runs a batch of P/D cases on SGLang's own NIXL KV manager (README.md,
"The protocol").

    python driver.py BATCH_DIR

reads BATCH_DIR/batch.json, imports SGLang once, checks first that it has
everything the driver drives (api_check.py; exit 3 naming every missing
piece), runs every case in this process and writes each case's result.json
(and its regions' final bytes) into the case's folder. Exit 0 when every
case has a result, whatever its status; 2 for a batch the driver cannot
read; 4 for `"nixl": "real"` where real NIXL does not load or start.

`"nixl"`: `"stand-in"` (fake_nixl.py, the default) or `"real"` (real NIXL
agents over host memory, UCX on loopback: real_nixl.py).
"""

import json
import os
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

BATCH_FORMAT = "kvgeom-sglang-batch/1"


def say(msg):
    print(f"driver: {msg}", file=sys.stderr, flush=True)


def main(argv):
    if len(argv) != 1:
        say("usage: driver.py BATCH_DIR")
        return 2
    batch_dir = os.path.abspath(argv[0])
    try:
        with open(os.path.join(batch_dir, "batch.json"), encoding="utf-8") as f:
            batch = json.load(f)
    except (OSError, ValueError) as e:
        say(f"cannot read {batch_dir}/batch.json: {e}")
        return 2
    if batch.get("format") != BATCH_FORMAT:
        say(f"batch.json: format {batch.get('format')!r}, expected {BATCH_FORMAT!r}")
        return 2
    choice = batch.get("nixl", "stand-in")
    if choice not in ("stand-in", "real"):
        say(f"batch.json: nixl {choice!r}, expected 'stand-in' or 'real'")
        return 2
    warnings.filterwarnings("ignore")
    import logging

    logging.getLogger("sglang").setLevel(logging.ERROR)
    t0 = time.time()
    import api_check
    import fake_nixl

    nixl, what, version = fake_nixl, "the NIXL stand-in", None
    if choice == "real":
        import real_nixl

        try:
            version = real_nixl.load()["version"]
        except real_nixl.NixlUnavailable as e:
            print(f"real NIXL: {e}; {real_nixl.INSTALL_HINT}", file=sys.stderr)
            return real_nixl.UNAVAILABLE_STATUS
        nixl, what = real_nixl, f"real NIXL {version} (UCX, host memory)"
    saved = nixl.install()
    gone = api_check.missing(stand_in=nixl.surface() if nixl is not fake_nixl else fake_nixl)
    nixl.uninstall(saved)
    sg, tv = api_check.version()
    if gone:
        say(f"this SGLang ({sg} (torch {tv})) lacks what the driver needs:")
        for line in gone:
            print(f"  - {line}", file=sys.stderr)
        return 3
    import case

    case.load(nixl)
    say(f"SGLang {sg} (torch {tv}) imported in {time.time() - t0:.1f} s; {what} moves the bytes")
    timeout = float(batch.get("case_timeout_s", 20))
    statuses = {}
    for spec in batch.get("cases", []):
        spec = dict(spec)
        d = spec.get("dir") or spec["id"]
        spec["dir"] = d if os.path.isabs(d) else os.path.join(batch_dir, d)
        os.makedirs(spec["dir"], exist_ok=True)
        result = case.run_case(spec, timeout_s=timeout)
        if nixl is not fake_nixl:
            result.update(nixl="real", nixl_version=version)
            nixl.close_all()
        with open(os.path.join(spec["dir"], "result.json"), "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1, default=str)
        statuses[spec["id"]] = result["status"]
        say(f"{spec['id']}: {result['status']}" + (f" ({result['message']})" if result.get("message") else ""))
    print(json.dumps(statuses))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
