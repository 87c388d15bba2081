"""Which vLLM an interpreter has, without importing it: the installed
version, the files of the package the interpreter imports that differ from
the hashes the installed distribution's dist-info RECORD lists (a release
edited in place, a branch copied over it, or another vLLM put first on
PYTHONPATH: Python loads every `vllm.*` module from the one folder
`import vllm` resolves to, and that folder's files are the ones compared,
those RECORD does not list included), and, when the package is a git checkout's working tree (an editable or
source install), that checkout's path, HEAD commit and whether it has local
changes. A venv that `scripts/install-vllm.sh --source` built from a git
checkout holds a copy of the tree's package, not the tree: the checkout as
it was at the build (path, commit, dirty) is read from the venv's
`.kvgeom-source`, which the install script writes.

`python provenance.py` prints one JSON object:
`{"version": V, "modified_files": [...], "unhashed": N, "source": null |
{"path": P, "commit": C, "dirty": B}, "substitutions": [...]}` (`unhashed`:
the package's files RECORD lists without a hash, which cannot be checked;
`substitutions`: the lines of the venv's `.kvgeom-substitutions`, the
release's dependency pins the package index lacked and `install-vllm.sh`
replaced, `WANTED -> CHOSEN (why)`).
"""

import base64
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys


def _digest(path, algorithm):
    h = hashlib.new(algorithm)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return base64.urlsafe_b64encode(h.digest()).rstrip(b"=").decode()


def _check(path, entry, name, modified):
    try:
        if _digest(path, entry.hash.mode) != entry.hash.value:
            modified.append(name)
    except FileNotFoundError:
        modified.append(f"{name} (deleted)")
    except (OSError, ValueError):
        modified.append(f"{name} (unreadable)")


def modified_files(dist, package_dir=None):
    """The package's files whose bytes differ from RECORD's hash (or that
    are gone), as RECORD names them; and how many RECORD lists unhashed.

    `package_dir`: the `vllm` folder the interpreter imports (None: the one
    beside the distribution). RECORD's `vllm/...` files are looked for
    there, and its other files (`.py` and compiled modules) that RECORD
    does not list are reported `(not in RECORD)`: an overlay on PYTHONPATH
    is compared file by file with the release the venv installed."""
    modified = []
    unhashed = 0
    if package_dir and not os.path.isfile(str(dist.locate_file("vllm/__init__.py"))):
        # The distribution's own package lost its __init__.py: that is the
        # edit to report, file by file, where RECORD puts it.
        package_dir = None
    root = os.path.dirname(package_dir) if package_dir else None
    listed = set()
    for entry in dist.files or ():
        name = str(entry).replace(os.sep, "/")
        in_package = name.startswith("vllm/")
        if in_package:
            listed.add(name)
        if entry.hash is None:
            unhashed += 1
            continue
        path = os.path.join(root, *name.split("/")) if root and in_package else entry.locate()
        _check(path, entry, name, modified)
    if package_dir and os.path.realpath(os.path.dirname(str(dist.locate_file("vllm/__init__.py")))) != os.path.realpath(package_dir):
        for folder, dirs, files in os.walk(package_dir):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for file in files:
                if not file.endswith((".py", ".so")):
                    continue
                rel = os.path.relpath(os.path.join(folder, file), root).replace(os.sep, "/")
                if rel not in listed:
                    modified.append(f"{rel} (not in RECORD)")
    return sorted(modified), unhashed


def loaded_modified(dist, modules=None):
    """After import: the files of the `vllm` modules this process loaded
    (each module's `__file__`) that differ from RECORD's hash or that RECORD
    does not list, as `vllm/...` paths; and whether `vllm.__version__`
    differs from the distribution's version (a line for it)."""
    modules = sys.modules if modules is None else modules
    record = {str(e).replace(os.sep, "/"): e for e in dist.files or ()}
    out = []
    for name, module in sorted(modules.items()):
        if name != "vllm" and not name.startswith("vllm."):
            continue
        file = getattr(module, "__file__", None)
        if not file:
            continue
        parts = os.path.abspath(file).split(os.sep)
        try:
            top = len(parts) - 1 - parts[::-1].index("vllm")
        except ValueError:
            continue
        rel = "/".join(parts[top:])
        entry = record.get(rel)
        if entry is None:
            out.append(f"{rel} (not in RECORD)")
        elif entry.hash is not None:
            _check(file, entry, rel, out)
    vllm = modules.get("vllm")
    version = getattr(vllm, "__version__", None)
    if version is not None and version != dist.version:
        out.append(f"vllm/__init__.py (imported version {version}, RECORD's {dist.version})")
    return sorted(set(out))


def _git(folder, *args):
    done = subprocess.run(
        ["git", "-C", folder, *args], capture_output=True, text=True, timeout=30
    )
    return done.stdout.strip() if done.returncode == 0 else None


def source_tree(package_dir):
    """The git checkout whose tracked files the package is, or None (a
    package merely inside some repository's ignored folder is not one)."""
    if not package_dir or not os.path.isdir(package_dir):
        return None
    try:
        if _git(package_dir, "ls-files", "--error-unmatch", "__init__.py") is None:
            return None
        top = _git(package_dir, "rev-parse", "--show-toplevel")
        commit = _git(package_dir, "rev-parse", "HEAD")
        status = _git(top, "status", "--porcelain", "--untracked-files=no") if top else None
    except (OSError, subprocess.SubprocessError):
        return None
    if not top or not commit or status is None:
        return None
    return {"path": top, "commit": commit, "dirty": bool(status)}


def built_from(prefix=None):
    """The checkout `install-vllm.sh --source` built this venv's vLLM from,
    as recorded at the build (`<venv>/.kvgeom-source`), or None."""
    path = os.path.join(prefix or sys.prefix, ".kvgeom-source")
    try:
        with open(path) as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict):
        return None
    tree, commit, dirty = record.get("path"), record.get("commit"), record.get("dirty")
    if not isinstance(tree, str) or not isinstance(commit, str) or not isinstance(dirty, bool):
        return None
    return {"path": tree, "commit": commit, "dirty": dirty}


def substitutions(prefix=None):
    """The dependency pins the install replaced (`<venv>/.kvgeom-substitutions`,
    one a line), or []."""
    path = os.path.join(prefix or sys.prefix, ".kvgeom-substitutions")
    try:
        with open(path) as f:
            return [line.strip() for line in f if line.strip()]
    except (OSError, UnicodeDecodeError):
        return []


def provenance():
    dist = importlib.metadata.distribution("vllm")
    spec = importlib.util.find_spec("vllm")
    package_dir = os.path.dirname(spec.origin) if spec and spec.origin else None
    modified, unhashed = modified_files(dist, package_dir)
    return {
        # As `importlib.metadata.version` reports it (what pip and vLLM's
        # own `__version__` read).
        "version": importlib.metadata.version("vllm"),
        "modified_files": modified,
        "unhashed": unhashed,
        "source": source_tree(package_dir) or built_from(),
        "substitutions": substitutions(),
    }


if __name__ == "__main__":
    sys.dont_write_bytecode = True
    json.dump(provenance(), sys.stdout)
    print()
