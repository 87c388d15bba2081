"""real_nixl.py's recording agents on real NIXL (no SGLang): the bytes move
by NIXL, the record reads as the stand-in's, NIXL's refusals are named.

Run: .sglang-venv/bin/python -m pytest sglang-driver/test_real_nixl.py
(the tests that start agents need `scripts/install-sglang.sh --nixl`).
"""

import os
import sys
import time

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fake_nixl  # noqa: E402
import real_nixl  # noqa: E402


def test_nixl_error_classes_are_named_by_their_status():
    class nixlNotFoundError(Exception):
        pass

    class nixlInvalidParamError(Exception):
        pass

    assert real_nixl._nixl_code(nixlNotFoundError()) == "NIXL_ERR_NOT_FOUND"
    assert real_nixl._nixl_code(nixlInvalidParamError()) == "NIXL_ERR_INVALID_PARAM"
    assert real_nixl._nixl_code(ValueError()) == "NIXL_ERR_UNKNOWN"


@pytest.fixture
def pair():
    """Two recording agents on real NIXL, one 4 KiB host region each,
    registered as SGLang registers its pools (VRAM, device 0)."""
    try:
        real_nixl.load()
    except real_nixl.NixlUnavailable as e:
        pytest.skip(f"real NIXL does not load here: {e} (scripts/install-sglang.sh --nixl)")
    fake_nixl.new_fabric()
    src = np.arange(4096, dtype=np.uint8) % 251
    dst = np.zeros(4096, dtype=np.uint8)
    api = real_nixl.LOADED["api"]
    cfg = api.nixl_agent_config(backends=["UCX"])
    a = real_nixl.RecordingAgent("test-A", cfg)
    b = real_nixl.RecordingAgent("test-B", cfg)
    a.register_memory([(src.ctypes.data, src.nbytes, 0, "")], "VRAM")
    b.register_memory([(dst.ctypes.data, dst.nbytes, 0, "")], "VRAM")
    a.add_remote_agent(b.get_agent_metadata())
    yield a, b, src, dst
    real_nixl.close_all()
    fake_nixl.FABRIC[0] = None


def strided(rows):
    return np.array(rows, dtype=np.uint64).reshape(-1, 5)


def test_a_write_moves_the_named_blocks_and_is_recorded_as_the_stand_in_records(pair):
    a, b, src, dst = pair
    local = a.prep_xfer_dlist("", strided([(src.ctypes.data, 256, 0, 256, 16)]), "VRAM")
    remote = a.prep_xfer_dlist("test-B", strided([(dst.ctypes.data, 256, 0, 256, 16)]), "VRAM")
    handle = a.make_prepped_xfer("WRITE", local, [3, 5], remote, [7, 0])
    state = a.transfer(handle)
    deadline = time.time() + 30
    while state not in ("DONE", "ERR") and time.time() < deadline:
        state = a.check_xfer_state(handle)
    assert state == "DONE"
    assert bytes(dst[7 * 256:8 * 256]) == bytes(src[3 * 256:4 * 256])
    assert bytes(dst[0:256]) == bytes(src[5 * 256:6 * 256])
    assert not dst[256:7 * 256].any() and not dst[8 * 256:].any()
    f = fake_nixl.current()
    assert [(d["agent"], d["target"], d["mem"], d["count"], d["refused"]) for d in f.dlists] == [
        ("test-A", "local", "VRAM", 16, None), ("test-A", "test-B", "VRAM", 16, None)]
    (x,) = f.xfers
    assert (x["local"], x["remote"], x["local_ids"], x["remote_ids"], x["posted"], x["peer"]) == (
        local, remote, [3, 5], [7, 0], True, "test-B")
    assert x["posted_by"]["thread"] == "MainThread"
    assert {r["mem"] for r in f.registrations} == {"VRAM"} and not f.refusals


def test_nixl_refuses_a_run_past_the_region_and_the_record_names_its_block(pair):
    a, b, src, dst = pair
    with pytest.raises(Exception) as e:
        a.prep_xfer_dlist("test-B", strided([(dst.ctypes.data, 256, 0, 256, 17)]), "VRAM")
    assert type(e.value).__name__ == "nixlNotFoundError"  # NIXL's own class
    f = fake_nixl.current()
    (r,) = f.refusals
    assert (r["agent"], r["target"], r["row"], r["block"], r["addr"]) == (
        "test-A", "test-B", 0, 16, dst.ctypes.data + 16 * 256)
    assert r["reason"].startswith("NIXL_ERR_NOT_FOUND: prep_xfer_dlist (real NIXL: nixlNotFoundError)")
    assert f.dlists[-1]["refused"] == r["reason"]
    # The same list one block shorter is NIXL's to accept.
    a.prep_xfer_dlist("test-B", strided([(dst.ctypes.data, 256, 0, 256, 16)]), "VRAM")
    assert len(f.refusals) == 1
