# Sourced by scripts/install-vllm-other.sh (`--torch-from VENV`) and
# scripts/install-sglang.sh: torch and
# its installed dependency closure hard-linked from another venv of this
# project (the pinned .vllm-venv/) instead of a second install of ~5 GB.
# Uses VENV (the venv being
# made) of the caller.

# Hard-links torch and its installed dependency closure from the donor venv
# into this venv's site-packages (file by file, from each distribution's
# RECORD). Exit 3: hard links impossible (e.g. another file system).
link_torch() {
    local donor="$1" dest
    dest="$("${VENV}/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    "${donor}/bin/python" - "${dest}" <<'EOF'
import errno, glob, importlib.metadata as md, os, re, sys
from pip._vendor.packaging.requirements import Requirement

dest = sys.argv[1]
dists = {}
for d in md.distributions():
    name = re.sub(r"[-_.]+", "-", (d.metadata["Name"] or "")).lower()
    dists.setdefault(name, d)
# (name, extra) pairs: torch asks for cuda-toolkit[cudart,cublas,...], whose
# libraries come in only through those extras.
todo, done, seen = [("torch", "")], set(), set()
while todo:
    name, extra = todo.pop()
    if (name, extra) in done or name not in dists:
        continue
    done.add((name, extra))
    seen.add(name)
    for spec in dists[name].requires or []:
        req = Requirement(spec)
        if req.marker is not None and not req.marker.evaluate({"extra": extra}):
            continue
        if req.marker is None and extra:
            continue  # already taken with extra ""
        dep = re.sub(r"[-_.]+", "-", req.name).lower()
        for x in [""] + sorted(req.extras):
            todo.append((dep, x))
# What the new venv already has (setuptools from ensurepip on Python 3.11)
# stays as it is: linking another version's files over it would mix two.
have = {re.sub(r"[-_.]+", "-", (d.metadata["Name"] or "")).lower() for d in md.distributions(path=[dest])}
kept = sorted(seen & have)
seen -= have

def with_bytecode(files):
    """The recorded files and, beside each module, the bytecode the donor
    has for it: an installer that compiles without recording the .pyc
    (uv) leaves them out of RECORD, and the drivers never write bytecode,
    so a venv without them compiles torch at every start."""
    for f in files:
        rel = os.path.normpath(str(f))
        yield rel
        if rel.endswith(".py"):
            folder, stem = os.path.split(rel[:-3])
            cache = os.path.join(base, folder, "__pycache__")
            if os.path.isdir(cache):
                for pyc in glob.glob(glob.escape(os.path.join(cache, stem)) + ".*.pyc"):
                    yield os.path.relpath(pyc, base)


linked = 0
for name in sorted(seen):
    d = dists[name]
    base = os.path.realpath(str(d.locate_file("")))
    for rel in with_bytecode(d.files or []):
        if rel.startswith(".."):
            continue  # console scripts outside site-packages
        src = os.path.join(base, rel)
        dst = os.path.join(dest, rel)
        if not os.path.isfile(src) or os.path.exists(dst):
            continue
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        try:
            os.link(src, dst)
        except OSError as e:
            if e.errno in (errno.EXDEV, errno.EPERM, errno.EMLINK):
                print(f"hard links impossible: {e}", file=sys.stderr)
                sys.exit(3)
            raise
        linked += 1
print(f"{len(seen)} distributions ({', '.join(sorted(seen))}), {linked} files"
      + (f"; the venv's own {', '.join(kept)} kept" if kept else ""), file=sys.stderr)
EOF
}

