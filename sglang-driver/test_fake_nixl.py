"""The NIXL stand-in on its own (no SGLang): containment, laziness, bytes.

Run: .sglang-venv/bin/python -m pytest sglang-driver/test_fake_nixl.py
"""

import ctypes
import os
import sys
import time

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fake_nixl  # noqa: E402


@pytest.fixture
def pair():
    """Two agents, each with one registered VRAM region of 4 KiB on device 0."""
    fake_nixl.new_fabric()
    src = np.arange(4096, dtype=np.uint8)
    dst = np.zeros(4096, dtype=np.uint8)
    a = fake_nixl.nixl_agent("A")
    b = fake_nixl.nixl_agent("B")
    a.register_memory([(src.ctypes.data, src.nbytes, 0, "")], "VRAM")
    b.register_memory([(dst.ctypes.data, dst.nbytes, 0, "")], "VRAM")
    a.add_remote_agent(b.get_agent_metadata())
    yield a, b, src, dst
    fake_nixl.FABRIC[0] = None


def strided(rows):
    return np.array(rows, dtype=np.uint64).reshape(-1, 5)


def test_in_region_lists_are_accepted(pair):
    a, b, src, dst = pair
    a.prep_xfer_dlist("", strided([(src.ctypes.data, 256, 0, 256, 16)]), "VRAM")  # exactly the region
    a.prep_xfer_dlist("B", strided([(dst.ctypes.data + 8, 8, 0, 512, 8)]), "VRAM")
    assert fake_nixl.current().refusals == []


@pytest.mark.parametrize(
    "target, rows, why",
    [
        ("", [(0, 256, 0, 256, 17)], "one block past the end of a local region"),
        ("B", [(0, 8, 0, 512, 9)], "one block past the end of the remote region"),
        ("B", [(-16, 8, 0, 8, 1)], "before the remote region"),
        ("B", [(0, 8, 1, 8, 4)], "another device"),
    ],
)
def test_out_of_region_descriptors_are_refused(pair, target, rows, why):
    a, b, src, dst = pair
    base = src.ctypes.data if target == "" else dst.ctypes.data
    rows = [(base + r[0], *r[1:]) for r in rows]
    with pytest.raises(fake_nixl.nixlNotFoundError, match="NIXL_ERR_NOT_FOUND"):
        a.prep_xfer_dlist(target, strided(rows), "VRAM")
    refusal = fake_nixl.current().refusals[-1]
    assert refusal["target"] == ("local" if target == "" else "B"), why
    listed = fake_nixl.current().dlists[-1]
    assert listed["refused"] and listed["rows"] == [list(r) for r in rows]


def test_wrong_memory_kind_is_refused(pair):
    a, b, src, dst = pair
    with pytest.raises(fake_nixl.nixlNotFoundError):
        a.prep_xfer_dlist("B", strided([(dst.ctypes.data, 8, 0, 8, 4)]), "DRAM")


def test_unknown_remote_agent_is_refused(pair):
    a, b, src, dst = pair
    with pytest.raises(fake_nixl.nixlNotFoundError, match="no metadata"):
        a.prep_xfer_dlist("C", strided([(dst.ctypes.data, 8, 0, 8, 4)]), "VRAM")


def test_initialize_xfer_checks_containment(pair):
    a, b, src, dst = pair
    local = a.get_xfer_descs([(src.ctypes.data, 64, 0)], "VRAM")
    remote = a.get_xfer_descs([(dst.ctypes.data + 4090, 64, 0)], "VRAM")
    with pytest.raises(fake_nixl.nixlNotFoundError):
        a.initialize_xfer("WRITE", local, remote, "B")
    assert fake_nixl.current().xfers[-1]["refused"].startswith("NIXL_ERR_NOT_FOUND")


def test_strided_lists_stay_lazy():
    """A run of 50 million blocks (SGLang warns a state pool holds millions
    of slots) is checked and indexed without expanding it."""
    fake_nixl.new_fabric()
    a = fake_nixl.nixl_agent("A")
    base = 1 << 40  # never dereferenced: nothing is transferred
    a.register_memory([(base, 50_000_000 * 64, 0, "")], "VRAM")
    t = time.time()
    h = a.prep_xfer_dlist("", strided([(base, 64, 0, 64, 50_000_000)]), "VRAM")
    runs = a.lists[h][0]
    assert runs.count == 50_000_000
    assert runs.desc(49_999_999) == (base + 49_999_999 * 64, 64, 0)
    assert time.time() - t < 1.0
    assert fake_nixl.current().dlists[-1]["rows"] == [[base, 64, 0, 64, 50_000_000]]
    with pytest.raises(fake_nixl.nixlNotFoundError):
        a.prep_xfer_dlist("", strided([(base, 64, 0, 64, 50_000_001)]), "VRAM")
    fake_nixl.FABRIC[0] = None


def test_prepped_write_moves_bytes_and_records_ids(pair):
    a, b, src, dst = pair
    ls = a.prep_xfer_dlist("", strided([(src.ctypes.data, 16, 0, 16, 256)]), "VRAM")
    rs = a.prep_xfer_dlist("B", strided([(dst.ctypes.data, 16, 0, 16, 256)]), "VRAM")
    h = a.make_prepped_xfer("WRITE", ls, [1, 3], rs, [10, 0])
    assert a.transfer(h) == "DONE"
    assert bytes(dst[160:176]) == bytes(src[16:32])
    assert bytes(dst[0:16]) == bytes(src[48:64])
    assert dst[16:160].sum() == 0 and dst[176:].sum() == 0
    x = fake_nixl.current().xfers[-1]
    assert x["posted"] and x["local_ids"] == [1, 3] and x["remote_ids"] == [10, 0] and x["peer"] == "B"
    # Out-of-range ids or mismatched lengths are refused, as NIXL does.
    with pytest.raises(fake_nixl.nixlInvalidParamError):
        a.make_prepped_xfer("WRITE", ls, [256], rs, [0])
    ctypes.memset(dst.ctypes.data, 0, 16)


def test_a_run_spread_over_two_adjacent_regions_is_refused():
    """NIXL 1.5.1 wants each strided run inside one registered region as a
    whole, even when every block of it lies in one of two adjacent regions."""
    fake_nixl.new_fabric()
    buf = np.zeros(8192, dtype=np.uint8)
    a = fake_nixl.nixl_agent("A")
    a.register_memory([(buf.ctypes.data, 4096, 0, ""), (buf.ctypes.data + 4096, 4096, 0, "")], "DRAM")
    with pytest.raises(fake_nixl.nixlNotFoundError, match="row 0 block 16"):
        a.prep_xfer_dlist("", strided([(buf.ctypes.data, 256, 0, 256, 32)]), "DRAM")
    a.prep_xfer_dlist("", strided([(buf.ctypes.data, 256, 0, 256, 16), (buf.ctypes.data + 4096, 256, 0, 256, 16)]),
                      "DRAM")
    fake_nixl.FABRIC[0] = None


def test_the_stand_in_refuses_what_real_nixl_refuses():
    """nixl_probe.py on real NIXL (installed by install-sglang.sh --nixl);
    skipped where it does not import or start."""
    import subprocess

    proc = subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "nixl_probe.py")],
                          capture_output=True, text=True, timeout=120)
    if proc.returncode == 4:
        pytest.skip(proc.stderr.strip().splitlines()[-1])
    assert proc.returncode == 0, proc.stdout[-3000:]
