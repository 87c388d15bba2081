#!/usr/bin/env python3
"""Compare two `kvgeom sweep --format json` reports case by case.

Usage: compare-reports.py A.json B.json

Cases are matched by (geometry, prompt_len, prefix_hit, mode, allocation,
seed, defect); their outcome, pass/fail and stats must be identical. Exits 1
on any difference, 2 on unreadable input.
"""
import json
import sys


def cases(path):
    try:
        with open(path) as f:
            report = json.load(f)
    except (OSError, ValueError) as e:
        print(f"error: {path}: {e}", file=sys.stderr)
        sys.exit(2)
    out = {}
    for c in report["cases"]:
        key = (c["geometry"], c["prompt_len"], c["prefix_hit"], c["mode"],
               c["allocation"], c["seed"], c["defect"])
        out[key] = (c["passed"], c["outcome"]["kind"], c["stats"])
    return out


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    a, b = cases(sys.argv[1]), cases(sys.argv[2])
    differ = 0
    for key in sorted(set(a) | set(b), key=str):
        if a.get(key) != b.get(key):
            differ += 1
            if differ <= 10:
                print(f"differs: {key}: {a.get(key)} vs {b.get(key)}")
    print(f"{len(a)} cases compared, {differ} differ")
    sys.exit(1 if differ else 0)


main()
