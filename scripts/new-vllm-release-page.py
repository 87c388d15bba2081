#!/usr/bin/env python3
"""Writes the draft page of scripts/new-vllm-release.sh: OUT/vllm-X.md.

Reads what the script's stages left in OUT (times.txt, check.txt,
sample.json, matrix.json and the per-release reports it names) and the two
installed vLLM packages (found through each interpreter without importing
vLLM), and writes:

- the NIXL connector version each release's handshake advertises (the
  `NIXL_CONNECTOR_VERSION` constant of its NIXL connector source);
- the NIXL connector files (`vllm/distributed/kv_transfer/kv_connector/v1/nixl*`)
  added, removed or changed between the two packages, by SHA-256;
- the matrix cells whose counts differ between the two releases, and per
  case (from the stored per-release reports) every case whose verdict
  changed;
- the shape check's output, the sample sweep's summary and each stage's time.

Only the standard library: it runs on the machine's python3.
"""

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys

NIXL_DIR = os.path.join("distributed", "kv_transfer", "kv_connector", "v1")
VERSION_RE = re.compile(r"^NIXL_CONNECTOR_VERSION\s*(?::\s*int)?\s*=\s*(\d+)", re.M)
CASES_SHOWN = 40


def package_dir(python):
    """The installed `vllm` package's folder for `python` and its version
    (from the distribution's metadata, `?` without one; vLLM not imported)."""
    code = (
        "import importlib.util as u, importlib.metadata as m, os\n"
        "print(os.path.dirname(u.find_spec('vllm').origin))\n"
        "try:\n    print(m.version('vllm'))\nexcept m.PackageNotFoundError:\n    print('?')\n"
    )
    out = subprocess.run(
        [python, "-c", code],
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise SystemExit(f"new-vllm-release-page: error: {python}: no vllm package ({out.stderr.strip()})")
    folder, version = out.stdout.strip().splitlines()[-2:]
    return folder, version


def nixl_files(package):
    """{path under the package: sha256} of the NIXL connector's files."""
    base = os.path.join(package, NIXL_DIR)
    if not os.path.isdir(base):
        return {}
    paths = []
    for entry in sorted(os.listdir(base)):
        path = os.path.join(base, entry)
        if not entry.startswith("nixl"):
            continue
        if os.path.isfile(path) and entry.endswith(".py"):
            paths.append(path)
        elif os.path.isdir(path):
            for d, dirs, names in os.walk(path):
                dirs[:] = [x for x in dirs if x != "__pycache__"]
                paths += [os.path.join(d, n) for n in names if n.endswith(".py")]
    files = {}
    for path in sorted(paths):
        with open(path, "rb") as f:
            files[os.path.join("vllm", os.path.relpath(path, package))] = hashlib.sha256(f.read()).hexdigest()
    return files


def connector_version(package, files):
    """The NIXL connector version in the release's source, or None."""
    for rel in files:
        with open(os.path.join(package, os.path.relpath(rel, "vllm")), encoding="utf-8", errors="replace") as f:
            m = VERSION_RE.search(f.read())
        if m:
            return int(m.group(1)), rel
    return None, None


def read_json(path):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def verdict(case):
    """A case's verdict as the page compares it: outcome kind and oracles."""
    kind = case.get("outcome", {}).get("kind", "?")
    oracles = sorted({v.get("oracle", "?") for v in case.get("violations") or []})
    return kind + (f" [{','.join(oracles)}]" if oracles else "")


def case_key(case):
    return (
        case.get("geometry"),
        case.get("mode"),
        case.get("allocation"),
        case.get("prompt_len"),
        case.get("prefix_hit"),
        case.get("request_path", "direct"),
    )


def cell_text(cell):
    if cell.get("not_run"):
        return "not run"
    parts = []
    for field, word in (("passed", "ok"), ("refused", "refused"), ("violations", "violations"),
                        ("crashed", "crashed"), ("hung", "hung"), ("errors", "errors")):
        if cell.get(field):
            parts.append(f"{cell[field]} {word}")
    text = ", ".join(parts) or "-"
    if cell.get("oracles"):
        text += f" [{','.join(cell['oracles'])}]"
    return text


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--version", required=True)
    ap.add_argument("--against", required=True, help="the pinned release's Python")
    ap.add_argument("--python", required=True, help="the new release's Python")
    ap.add_argument("--out", required=True, help="the folder of the script's stages")
    args = ap.parse_args()

    (new_pkg, _), (old_pkg, old_name) = package_dir(args.python), package_dir(args.against)
    new_files, old_files = nixl_files(new_pkg), nixl_files(old_pkg)
    new_ver, new_at = connector_version(new_pkg, new_files)
    old_ver, old_at = connector_version(old_pkg, old_files)

    matrix = read_json(os.path.join(args.out, "matrix.json")) or {}
    releases = matrix.get("releases", [])
    lines = [f"# vLLM {args.version} (draft)", ""]
    lines += [
        f"Written by `scripts/new-vllm-release.sh {args.version}` against vLLM {old_name} "
        f"(`{args.against}`). A draft: read each change below in the release's source before "
        "it becomes a finding, a policy or an expectations file.",
        "",
        "## NIXL connector",
        "",
        f"- Handshake version (`NIXL_CONNECTOR_VERSION`): **{new_ver if new_ver is not None else 'not found'}** "
        f"in {args.version} (`{new_at or '-'}`), {old_ver if old_ver is not None else 'not found'} "
        f"in {old_name} (`{old_at or '-'}`).",
    ]
    added = sorted(set(new_files) - set(old_files))
    removed = sorted(set(old_files) - set(new_files))
    changed = sorted(f for f in set(new_files) & set(old_files) if new_files[f] != old_files[f])
    same = len(set(new_files) & set(old_files)) - len(changed)
    lines.append(
        f"- Files under `vllm/{NIXL_DIR}/nixl*` (SHA-256): {len(changed)} changed, {len(added)} added, "
        f"{len(removed)} removed, {same} unchanged."
    )
    lines.append("")
    if changed or added or removed:
        lines += ["| file | change |", "|---|---|"]
        lines += [f"| `{f}` | changed |" for f in changed]
        lines += [f"| `{f}` | added |" for f in added]
        lines += [f"| `{f}` | removed |" for f in removed]
        lines.append("")

    lines += ["## Driver shape check", ""]
    try:
        with open(os.path.join(args.out, "check.txt"), encoding="utf-8") as f:
            # The check prints one item a line, indented; the rest is vLLM's
            # and torch's import noise.
            items = [l.strip() for l in f if l.startswith("  ")]
    except OSError:
        items = None
    if items is None:
        lines.append("Not run (`check.txt` is missing).")
    else:
        refused = [i for i in items if not i.startswith("absent, done without")]
        lines.append(f"Refused: {len(refused)} pieces the driver needs are missing or reshaped."
                     if refused else "Nothing the driver needs is missing or reshaped.")
        if items:
            lines += ["", "```"] + items + ["```"]
    lines.append("")

    sample = read_json(os.path.join(args.out, "sample.json"))
    lines += ["## Sample live sweep", ""]
    if sample:
        counts = {}
        for c in sample.get("cases", []):
            k = c.get("outcome", {}).get("kind", "?")
            counts[k] = counts.get(k, 0) + 1
        s = sample.get("summary", {})
        lines.append(
            f"{s.get('cases', 0)} cases, {s.get('passed', 0)} passed: "
            + ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
            + " (`sample.json`)."
        )
    else:
        lines.append("No report: the sweep did not run (`sample.err`).")
    lines.append("")

    lines += ["## Verdicts that changed", ""]
    if len(releases) < 2:
        lines.append("No matrix report: the matrix was skipped (`--skip-matrix`) or did not run (`matrix.err`).")
        lines.append("")
    else:
        for r in releases:
            lines.append(
                f"- {r.get('describe') or r.get('python')}: {r.get('status')}"
                + (f", {r.get('cases')} cases, plans compared with `--policy {r.get('compared_with')}`"
                   if r.get("status") == "ran" else f": {r.get('not_run', '')}")
            )
        lines.append("")
        old_v, new_v = releases[0].get("version"), releases[1].get("version")
        cells = {}
        for c in matrix.get("cells", []):
            cells.setdefault((c["geometry"], c["mode"]), {})[c.get("python")] = c
        rows = []
        for (g, m), by in cells.items():
            a, b = by.get(releases[0]["python"]), by.get(releases[1]["python"])
            if a is None or b is None:
                continue
            ta, tb = cell_text(a), cell_text(b)
            if ta != tb:
                rows.append(f"| {g} | {m} | {ta} | {tb} |")
        lines.append(f"Cells (geometry and mode) whose counts differ: {len(rows)} of {len(cells)}.")
        lines.append("")
        if rows:
            lines += [f"| geometry | mode | {old_v} | {new_v} |", "|---|---|---|---|"] + rows + [""]
        reports = [read_json(r.get("report") or "") for r in releases[:2]]
        if all(reports):
            old_cases = {case_key(c): c for c in reports[0].get("cases", [])}
            diffs = []
            for c in reports[1].get("cases", []):
                o = old_cases.get(case_key(c))
                if o is not None and verdict(o) != verdict(c):
                    diffs.append((c, o))
            lines.append(f"Cases whose verdict (outcome and oracles) changed: {len(diffs)}.")
            lines.append("")
            if diffs:
                lines += [f"| case | {old_v} | {new_v} |", "|---|---|---|"]
                for c, o in diffs[:CASES_SHOWN]:
                    label = (f"{c.get('geometry')} N={c.get('prompt_len')} h={c.get('prefix_hit')} "
                             f"{c.get('mode')} {c.get('allocation')}")
                    lines.append(f"| {label} | {verdict(o)} | {verdict(c)} |")
                if len(diffs) > CASES_SHOWN:
                    lines.append(f"| ... {len(diffs) - CASES_SHOWN} more (the stored reports) | | |")
                lines.append("")
        else:
            lines.append("The per-release reports are not readable; per-case changes not listed.")
            lines.append("")

    lines += ["## Time of each stage", "", "| stage | seconds | exit |", "|---|---|---|"]
    try:
        with open(os.path.join(args.out, "times.txt"), encoding="utf-8") as f:
            for line in f:
                parts = line.split()
                if len(parts) == 3:
                    lines.append(f"| {parts[0]} | {parts[1]} | {parts[2]} |")
    except OSError:
        pass
    try:
        load = os.getloadavg()[0]
        lines += ["", f"Load average at the end: {load:.1f} ({os.cpu_count()} cores)."]
    except OSError:
        pass
    page = os.path.join(args.out, f"vllm-{args.version}.md")
    with open(page, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
