"""Which vLLM an interpreter has, without importing it: the installed
version, the files of the installed package that differ from the hashes its
dist-info RECORD lists (a release edited in place, or a branch copied over
it), and, when the package is a git checkout's working tree (an editable or
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


def modified_files(dist):
    """The package's files whose bytes differ from RECORD's hash (or that
    are gone), as RECORD names them; and how many RECORD lists unhashed."""
    modified = []
    unhashed = 0
    for entry in dist.files or ():
        if entry.hash is None:
            unhashed += 1
            continue
        path = entry.locate()
        try:
            if _digest(path, entry.hash.mode) != entry.hash.value:
                modified.append(str(entry))
        except FileNotFoundError:
            modified.append(f"{entry} (deleted)")
        except (OSError, ValueError):
            modified.append(f"{entry} (unreadable)")
    return sorted(modified), unhashed


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
    modified, unhashed = modified_files(dist)
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
