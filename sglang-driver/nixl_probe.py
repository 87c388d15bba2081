"""Holds the stand-in's containment rule to real NIXL's.

    python nixl_probe.py

prepares the same descriptor lists on real NIXL agents (the `nixl` package:
`scripts/install-sglang.sh --nixl`, host memory over UCX) and on the
stand-in's, and prints, per list, whether each accepted it or refused it.
Exit 0 when they agree on every list, 1 when not, 4 when real NIXL does not
import or start here.

The memory: agent A registers two adjacent 4 KiB host regions (one 8 KiB
buffer, registered as two), agent B one 4 KiB region; A prepares local
lists and lists on B.
"""

import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# (name, target: "" = A's own regions, "B" = the peer's, rows relative to the
# target's first region as (offset, len, dev, stride, count) or (offset, len, dev)
# [, the list's memory kind, DRAM when absent])
CASES = [
    ("a strided run inside one region", "", [(0, 256, 0, 256, 16)]),
    ("a strided run exactly the second region", "", [(4096, 256, 0, 256, 16)]),
    ("one block past the last region", "", [(4096, 256, 0, 256, 17)]),
    ("a run over two adjacent regions, every block inside one", "", [(0, 256, 0, 256, 32)]),
    ("a sparse run, last block in the adjacent region", "", [(0, 16, 0, 512, 9)]),
    ("a sparse run inside one region", "", [(0, 16, 0, 512, 8)]),
    ("one strided row per region", "", [(0, 256, 0, 256, 16), (4096, 256, 0, 256, 16)]),
    ("one plain row per region", "", [(0, 256, 0), (4096, 256, 0)]),
    ("a block straddling the two regions", "", [(4088, 16, 0, 16, 1)]),
    ("a plain row straddling the two regions", "", [(4088, 16, 0)]),
    ("before the first region", "", [(-16, 8, 0, 8, 1)]),
    ("another device id", "", [(0, 256, 1, 256, 4)]),
    ("remote: a run inside the region", "B", [(0, 256, 0, 256, 16)]),
    ("remote: one block past the region", "B", [(0, 256, 0, 256, 17)]),
    ("remote: another device id", "B", [(0, 256, 3, 256, 1)]),
    ("a VRAM list over host (DRAM) regions", "", [(0, 256, 0, 256, 4)], "VRAM"),
]


def run(api):
    """accepted/refused per case with agents from `api` (a module with
    nixl_agent and nixl_agent_config)."""
    cfg = api.nixl_agent_config(backends=["UCX"]) if hasattr(api, "nixl_agent_config") else None
    a = api.nixl_agent("probe-A", cfg)
    b = api.nixl_agent("probe-B", cfg)
    src = np.zeros(8192, dtype=np.uint8)
    dst = np.zeros(4096, dtype=np.uint8)
    a.register_memory([(src.ctypes.data, 4096, 0, ""), (src.ctypes.data + 4096, 4096, 0, "")], "DRAM")
    b.register_memory([(dst.ctypes.data, 4096, 0, "")], "DRAM")
    a.add_remote_agent(b.get_agent_metadata())
    out = []
    for name, target, rows, *kind in CASES:
        base = src.ctypes.data if target == "" else dst.ctypes.data
        arr = np.array([(base + r[0], *r[1:]) for r in rows], dtype=np.uint64)
        try:
            a.prep_xfer_dlist("probe-B" if target else "", arr, kind[0] if kind else "DRAM")
            out.append("accepted")
        except Exception as e:
            out.append(f"refused ({type(e).__name__})")
    return out


def main():
    try:
        import nixl._api as real
    except Exception as e:
        print(f"nixl_probe: real NIXL does not import: {type(e).__name__}: {e}", file=sys.stderr)
        return 4
    if getattr(sys.modules.get("nixl"), "KVGEOM_STAND_IN", False):
        print("nixl_probe: the stand-in is installed as nixl; run this in its own process", file=sys.stderr)
        return 4
    try:
        real_out = run(real)
    except Exception as e:
        print(f"nixl_probe: real NIXL agents do not start here: {type(e).__name__}: {e}", file=sys.stderr)
        return 4
    import fake_nixl

    fake_nixl.new_fabric()
    fake_out = run(fake_nixl)
    rows = [
        {"list": name, "real": r, "stand_in": f, "agree": r.split(" ")[0] == f.split(" ")[0]}
        for (name, *_), r, f in zip(CASES, real_out, fake_out)
    ]
    print(json.dumps({"nixl": real_version(), "lists": rows}, indent=1))
    return 0 if all(r["agree"] for r in rows) else 1


def real_version():
    try:
        import importlib.metadata as md

        return md.version("nixl")
    except Exception:
        return None


if __name__ == "__main__":
    sys.exit(main())
