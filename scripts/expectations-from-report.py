#!/usr/bin/env python3
"""Writes an expectations file (expected/*.toml, docs/report-format.md
"Expectations files") from a live sweep's JSON report: one [[failure]] entry
per geometry, mode (and allocation where they differ), outcome and oracle
set, listing exactly the cases that failed so (or "all").

Usage: scripts/expectations-from-report.py REPORT.json --release X
           --finding RULES.toml [--out FILE]

REPORT.json: `kvgeom sweep --connector vllm --format json` or a release's
report that `kvgeom matrix --out-dir DIR` keeps. RULES.toml names the
finding of each entry: a list of [[rule]] tables with `finding` and any of
`geometry`, `mode`, `outcome`, `oracles` (the exact set violated; the first
rule matching an entry wins; an
entry no rule matches is an error, exit 2). The result is a starting point
to read: every entry is what the release did, not why.
"""

import argparse
import collections
import json
import sys

try:
    import tomllib
except ImportError:  # Python < 3.11
    tomllib = None


def fail(message):
    print(f"expectations-from-report: error: {message}", file=sys.stderr)
    sys.exit(2)


def ranges(numbers):
    """`1..=8,10` of a sorted list of prompt lengths."""
    out, start, prev = [], None, None
    for n in numbers:
        if start is None:
            start = prev = n
        elif n == prev + 1:
            prev = n
        else:
            out.append(str(start) if start == prev else f"{start}..={prev}")
            start = prev = n
    if start is not None:
        out.append(str(start) if start == prev else f"{start}..={prev}")
    return ",".join(out)


def passed(case):
    return case["outcome"]["kind"] in ("passed", "expected_rejection") and not case["violations"]


def signature(case):
    kind = case["outcome"]["kind"]
    oracles = tuple(sorted({v["oracle"] for v in case["violations"]}))
    if kind == "passed" and oracles:
        kind = "violations"
    return kind, oracles


def pattern(cases):
    by_hit = collections.defaultdict(list)
    for c in cases:
        by_hit[c["prefix_hit"]].append(c["prompt_len"])
    return [f"{ranges(sorted(set(ns)))}/{h}" for h, ns in sorted(by_hit.items())]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("report")
    ap.add_argument("--release", required=True)
    ap.add_argument("--finding", required=True, help="RULES.toml")
    ap.add_argument("--out")
    args = ap.parse_args()
    if tomllib is None:
        fail("needs Python 3.11 or later (tomllib)")
    try:
        with open(args.report) as f:
            report = json.load(f)
        with open(args.finding, "rb") as f:
            rules = tomllib.load(f).get("rule", [])
    except (OSError, ValueError) as e:
        fail(str(e))
    groups = collections.OrderedDict()
    for c in report.get("cases", []):
        groups.setdefault((c["geometry"], c["mode"]), []).append(c)
    entries = []
    for (geometry, mode), cases in groups.items():
        bad = [c for c in cases if not passed(c)]
        if not bad:
            continue
        sigs = collections.OrderedDict()
        for c in bad:
            sigs.setdefault(signature(c), []).append(c)
        allocs = sorted({c["allocation"] for c in cases})
        for (kind, oracles), failing in sigs.items():
            if len(failing) == len(cases):
                entries.append((geometry, mode, None, "all", kind, oracles))
                continue
            per_alloc = {a: sorted((c["prompt_len"], c["prefix_hit"]) for c in failing if c["allocation"] == a) for a in allocs}
            same = len({tuple(v) for v in per_alloc.values()}) == 1
            if same:
                entries.append((geometry, mode, None, pattern([c for c in failing if c["allocation"] == allocs[0]]), kind, oracles))
            else:
                for a in allocs:
                    mine = [c for c in failing if c["allocation"] == a]
                    if mine:
                        entries.append((geometry, mode, a, pattern(mine), kind, oracles))
    lines = [
        f"# What vLLM {args.release} as released gets wrong on geometries/, case by case,",
        f"# as `kvgeom matrix` (and `kvgeom sweep --connector vllm`) ran it; written by",
        f"# scripts/expectations-from-report.py from that run's report. Format:",
        f"# docs/report-format.md (\"Expectations files\").",
    ]
    for geometry, mode, alloc, cases, kind, oracles in entries:
        finding = None
        for r in rules:
            if all(r.get(k) in (None, v) for k, v in (("geometry", geometry), ("mode", mode), ("outcome", kind))) and (
                "oracles" not in r or sorted(r["oracles"]) == sorted(oracles)
            ):
                finding = r["finding"]
                break
        if finding is None:
            fail(f"no rule names the finding of {geometry} {mode} {kind}")
        lines.append("")
        lines.append("[[failure]]")
        lines.append(f'geometry = "{geometry}"')
        lines.append(f'mode = "{mode}"')
        if alloc:
            lines.append(f'alloc = "{alloc}"')
        if cases == "all":
            lines.append('cases = "all"')
        else:
            lines.append("cases = [" + ", ".join(f'"{c}"' for c in cases) + "]")
        lines.append(f'outcome = "{kind}"')
        if oracles:
            lines.append("oracles = [" + ", ".join(f'"{o}"' for o in oracles) + "]")
        lines.append(f'finding = "{finding}"')
    text = "\n".join(lines) + "\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
