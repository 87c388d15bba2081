"""The per-release API profiles (compat.py) and the stand-in's NIXL
notifications, which releases before 0.5.17 read to learn that KV arrived.

Run: <venv>/bin/python -m pytest sglang-driver/test_compat.py (any
installed release: the profile test checks the installed one's row).
"""

import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compat  # noqa: E402
import fake_nixl  # noqa: E402


def test_every_profile_row_names_every_feature():
    features = set(compat.PROFILES["0.5.23"])
    for release, row in compat.PROFILES.items():
        assert set(row) == features, release
    for (feature, value) in list(compat.NOT_USED) + list(compat.INSTEAD):
        assert feature in features and any(row[feature] == value for row in compat.PROFILES.values())


def test_compat_profile_of_the_installed_release():
    """Detection on the installed SGLang gives its row of PROFILES (the
    table the README and docs/sglang.md state)."""
    import importlib.metadata as md

    try:
        version = md.version("sglang")
    except md.PackageNotFoundError:
        pytest.skip("no SGLang installed in this interpreter")
    if version not in compat.PROFILES:
        pytest.skip(f"SGLang {version} has no row in compat.PROFILES (not run by the driver yet)")
    saved = fake_nixl.install()
    try:
        detected = compat.detect_installed()
    finally:
        fake_nixl.uninstall(saved)
    assert detected == compat.PROFILES[version]


def test_a_transfer_notification_reaches_the_target_agent_once():
    fake_nixl.new_fabric()
    try:
        src = np.arange(64, dtype=np.uint8)
        dst = np.zeros(64, dtype=np.uint8)
        a = fake_nixl.nixl_agent("A")
        b = fake_nixl.nixl_agent("B")
        a.register_memory([(src.ctypes.data, 64, 0, "")], "VRAM")
        b.register_memory([(dst.ctypes.data, 64, 0, "")], "VRAM")
        a.add_remote_agent(b.get_agent_metadata())
        local = a.get_xfer_descs([(src.ctypes.data, 64, 0)], "VRAM")
        remote = a.get_xfer_descs([(dst.ctypes.data, 64, 0)], "VRAM")
        h = a.initialize_xfer("WRITE", local, remote, "B", b"7_kv_0_1_0")
        assert b.get_new_notifs() == {}  # nothing before the transfer is posted
        a.transfer(h)
        assert bytes(dst) == bytes(src)
        assert b.get_new_notifs() == {"A": [b"7_kv_0_1_0"]}
        assert b.get_new_notifs() == {}  # read once
        a.send_notif("B", b"7_aux")
        assert b.get_new_notifs() == {"A": [b"7_aux"]}
        assert a.get_new_notifs() == {}
    finally:
        fake_nixl.FABRIC[0] = None
