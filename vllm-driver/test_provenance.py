"""provenance.py on a package built here: untouched, edited, deleted, and
a git checkout's working tree (clean and with a local change)."""

import base64
import hashlib
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def _hash(data):
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _install(site, files):
    """A package `vllm` with `files` (name -> bytes) and its dist-info."""
    pkg = site / "vllm"
    pkg.mkdir(parents=True)
    rows = []
    for name, data in files.items():
        (pkg / name).write_bytes(data)
        rows.append(f"vllm/{name},{_hash(data)},{len(data)}")
    info = site / "vllm-9.9.9.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 9.9.9\n")
    rows += ["vllm-9.9.9.dist-info/METADATA,,", "vllm-9.9.9.dist-info/RECORD,,"]
    (info / "RECORD").write_text("\n".join(rows) + "\n")
    return pkg


def _provenance(site):
    env = dict(os.environ, PYTHONPATH=str(site))
    out = subprocess.run(
        [sys.executable, os.path.join(HERE, "provenance.py")],
        env=env, capture_output=True, text=True, check=True,
    ).stdout
    return json.loads(out)


FILES = {"__init__.py": b"VERSION = 1\n", "worker.py": b"def f():\n    return 1\n"}


def test_an_untouched_install_has_no_modified_files(tmp_path):
    _install(tmp_path, FILES)
    p = _provenance(tmp_path)
    assert p["version"] == "9.9.9"
    assert p["modified_files"] == []
    assert p["unhashed"] == 2
    assert p["source"] is None


def test_an_edited_and_a_deleted_file_are_named(tmp_path):
    pkg = _install(tmp_path, FILES)
    (pkg / "worker.py").write_bytes(b"def f():\n    return 2\n")
    (pkg / "__init__.py").unlink()
    p = _provenance(tmp_path)
    assert p["modified_files"] == ["vllm/__init__.py (deleted)", "vllm/worker.py"]


def _git(cwd, *args):
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True)


def test_a_git_checkout_names_its_commit_and_local_changes(tmp_path):
    pkg = _install(tmp_path, FILES)
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", "vllm")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True,
                          text=True, check=True).stdout.strip()
    clean = _provenance(tmp_path)["source"]
    assert clean == {"path": str(tmp_path.resolve()), "commit": head, "dirty": False}
    (pkg / "worker.py").write_bytes(b"changed\n")
    assert _provenance(tmp_path)["source"]["dirty"] is True


def test_a_package_in_an_ignored_folder_of_a_repository_is_no_checkout(tmp_path):
    _git(tmp_path, "init", "-q")
    (tmp_path / ".gitignore").write_text("venv/\n")
    _install(tmp_path / "venv", FILES)
    assert _provenance(tmp_path / "venv")["source"] is None


def test_a_venv_built_from_a_checkout_names_the_checkout_it_recorded(tmp_path):
    sys.path.insert(0, HERE)
    import provenance

    record = {"path": "/src/vllm", "commit": "c" * 40, "dirty": True}
    assert provenance.built_from(str(tmp_path)) is None
    (tmp_path / ".kvgeom-source").write_text(json.dumps(record))
    assert provenance.built_from(str(tmp_path)) == record
    for broken in ("not json", "[]", json.dumps({**record, "dirty": "yes"})):
        (tmp_path / ".kvgeom-source").write_text(broken)
        assert provenance.built_from(str(tmp_path)) is None


def test_substitutions_are_read_from_the_venv(tmp_path):
    sys.path.insert(0, HERE)
    import provenance

    assert provenance.substitutions(str(tmp_path)) == []
    line = "flashinfer-python==0.7.3 -> flashinfer-python==0.7.4 (the pin is not on the package index)"
    (tmp_path / ".kvgeom-substitutions").write_text(line + "\n\n")
    assert provenance.substitutions(str(tmp_path)) == [line]


def test_loaded_modules_are_compared_with_the_record(tmp_path):
    sys.path.insert(0, HERE)
    import importlib.metadata
    import types

    import provenance

    site = tmp_path / "venv"
    _install(site, FILES)
    dist = next(importlib.metadata.distributions(path=[str(site)]))
    pkg = site / "vllm"
    same = types.SimpleNamespace(__file__=str(pkg / "__init__.py"), __version__=dist.version)
    assert provenance.loaded_modified(dist, {"vllm": same, "other": same}) == []
    (tmp_path / "overlay" / "vllm").mkdir(parents=True)
    edited = tmp_path / "overlay" / "vllm" / "__init__.py"
    edited.write_text("# a branch\n")
    extra = tmp_path / "overlay" / "vllm" / "pairing.py"
    extra.write_text("")
    modules = {
        "vllm": types.SimpleNamespace(__file__=str(edited), __version__="0.99.0.dev1"),
        "vllm.pairing": types.SimpleNamespace(__file__=str(extra)),
    }
    assert provenance.loaded_modified(dist, modules) == [
        "vllm/__init__.py",
        f"vllm/__init__.py (imported version 0.99.0.dev1, RECORD's {dist.version})",
        "vllm/pairing.py (not in RECORD)",
    ]
