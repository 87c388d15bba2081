#!/usr/bin/env python3
"""Compare kvgeom reports, or two whole baselines, case by case.

Usage:
  compare-reports.py A.json B.json
      Two `kvgeom sweep --format json` reports: cases are matched by
      (geometry, prompt_len, prefix_hit, mode, allocation, seed, defect);
      their outcome, pass/fail and stats must be identical.

  compare-reports.py --baseline BEFORE_DIR AFTER_DIR [--additions FILE]
      Two folders written by scripts/record-baseline.sh. Every JSON report
      is compared recursively: cases matched by the key above, trace
      verdicts by file, defects by name; every value BEFORE has must be
      equal in AFTER (violations and plans included). A field or a text
      line that only AFTER has is an addition: it passes only when its
      path is listed in the additions file (default
      scripts/baseline-additions.txt, one documented path per line). The
      explain texts must be equal line for line except listed added
      lines, and every command's exit status must be equal.

Exits 1 on any difference, 2 on unreadable input.
"""
import difflib
import json
import os
import sys

CASE_KEY = ("geometry", "prompt_len", "prefix_hit", "mode", "allocation",
            "seed", "defect")


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        print(f"error: {path}: {e}", file=sys.stderr)
        sys.exit(2)


def cases(path):
    out = {}
    for c in load(path)["cases"]:
        key = tuple(c[k] for k in CASE_KEY)
        out[key] = (c["passed"], c["outcome"]["kind"], c["stats"])
    return out


def compare_two_sweeps(a_path, b_path):
    a, b = cases(a_path), cases(b_path)
    differ = 0
    for key in sorted(set(a) | set(b), key=str):
        if a.get(key) != b.get(key):
            differ += 1
            if differ <= 10:
                print(f"differs: {key}: {a.get(key)} vs {b.get(key)}")
    print(f"{len(a)} cases compared, {differ} differ")
    return differ == 0


def identity(item):
    """How an element of a list is matched across the two reports."""
    if not isinstance(item, dict):
        return None
    if all(k in item for k in CASE_KEY):
        return tuple(str(item[k]) for k in CASE_KEY)
    for k in ("file", "defect", "name"):
        if k in item:
            return (k, str(item[k]))
    return None


class Walk:
    def __init__(self):
        self.differences = []
        self.additions = set()

    def differ(self, where, message):
        self.differences.append(f"{where}: {message}")

    def value(self, a, b, where, shape):
        if isinstance(a, dict) and isinstance(b, dict):
            for k in a:
                if k not in b:
                    self.differ(f"{where}.{k}", "missing after")
                else:
                    self.value(a[k], b[k], f"{where}.{k}", f"{shape}.{k}")
            for k in b:
                if k not in a:
                    self.additions.add(f"{shape}.{k}")
        elif isinstance(a, list) and isinstance(b, list):
            ids_a = [identity(x) for x in a]
            ids_b = [identity(x) for x in b]
            keyed = (all(i is not None for i in ids_a + ids_b)
                     and len(set(ids_a)) == len(a) and len(set(ids_b)) == len(b))
            if keyed:
                by_b = dict(zip(ids_b, b))
                for i, x in zip(ids_a, a):
                    if i not in by_b:
                        self.differ(f"{where}[{i}]", "missing after")
                    else:
                        self.value(x, by_b[i], f"{where}[{i}]", f"{shape}[]")
                for i in set(ids_b) - set(ids_a):
                    self.differ(f"{where}[{i}]", "only after")
            elif len(a) != len(b):
                self.differ(where, f"{len(a)} items before, {len(b)} after")
            else:
                for n, (x, y) in enumerate(zip(a, b)):
                    self.value(x, y, f"{where}[{n}]", f"{shape}[]")
        elif a != b:
            self.differ(where, f"{json.dumps(a)[:200]} before, {json.dumps(b)[:200]} after")


def read_lines(path):
    try:
        with open(path, errors="replace") as f:
            return f.read().splitlines()
    except OSError as e:
        print(f"error: {path}: {e}", file=sys.stderr)
        sys.exit(2)


def read_additions(path):
    if not os.path.exists(path):
        return set()
    allowed = set()
    for line in read_lines(path):
        line = line.split("#", 1)[0].strip()
        if line:
            allowed.add(line)
    return allowed


def compare_baselines(before, after, additions_file):
    allowed = read_additions(additions_file)
    walk = Walk()
    names = sorted(n for n in os.listdir(before) if n.endswith(".json"))
    for name in names:
        if not os.path.exists(os.path.join(after, name)):
            walk.differ(name, "missing after")
            continue
        walk.value(load(os.path.join(before, name)), load(os.path.join(after, name)),
                   name, name.split(".")[0])
    status = {}
    for which, folder in (("before", before), ("after", after)):
        for line in read_lines(os.path.join(folder, "status")):
            name, _, rc = line.rpartition(" ")
            status.setdefault(name, {})[which] = rc
    for name, rcs in sorted(status.items()):
        if rcs.get("before") != rcs.get("after"):
            walk.differ(f"status {name}", f"{rcs.get('before')} before, {rcs.get('after')} after")
    explain = os.path.join(before, "explain")
    texts = sorted(os.listdir(explain)) if os.path.isdir(explain) else []
    for name in texts:
        a = read_lines(os.path.join(explain, name))
        b_path = os.path.join(after, "explain", name)
        if not os.path.exists(b_path):
            walk.differ(f"explain/{name}", "missing after")
            continue
        for line in difflib.unified_diff(a, read_lines(b_path), lineterm="", n=0):
            if line.startswith(("---", "+++", "@@")):
                continue
            if line.startswith("-"):
                walk.differ(f"explain/{name}", f"line gone or changed: {line[1:][:160]}")
            elif line.startswith("+"):
                walk.additions.add("explain: " + line[1:].split(":", 1)[0].strip())
    unlisted = sorted(walk.additions - allowed)
    for d in walk.differences[:20]:
        print(f"differs: {d}")
    if len(walk.differences) > 20:
        print(f"... and {len(walk.differences) - 20} more differences")
    for a in sorted(walk.additions & allowed):
        print(f"addition (documented): {a}")
    for a in unlisted:
        print(f"addition (not in {additions_file}): {a}")
    print(f"{len(names)} reports and {len(texts)} explain texts compared: "
          f"{len(walk.differences)} differences, {len(walk.additions)} additions "
          f"({len(unlisted)} undocumented)")
    return not walk.differences and not unlisted


def main():
    args = sys.argv[1:]
    if args and args[0] == "--baseline":
        rest = args[1:]
        additions = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                 "baseline-additions.txt")
        if "--additions" in rest:
            i = rest.index("--additions")
            if i + 1 >= len(rest):
                print(__doc__, file=sys.stderr)
                sys.exit(2)
            additions = rest[i + 1]
            rest = rest[:i] + rest[i + 2:]
        if len(rest) != 2 or not all(os.path.isdir(d) for d in rest):
            print(__doc__, file=sys.stderr)
            sys.exit(2)
        ok = compare_baselines(rest[0], rest[1], additions)
    elif len(args) == 2:
        ok = compare_two_sweeps(*args)
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(0 if ok else 1)


main()
