"""failure.py: an exception raised in the driver's code, or a call vLLM
rejects because the driver passed it something malformed, is a harness
error naming the driver's file and line; what vLLM raises on its own, and
what the NIXL stand-in answers vLLM, stays vLLM's.

Run: python -m pytest vllm-driver/test_failure.py (no vLLM needed: "vLLM"
here is a module written outside vllm-driver/).
"""

import importlib.util
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import failure  # noqa: E402

VLLM_CODE = '''
def own_bug():
    raise AssertionError("vLLM's own assertion")

def calls_back(fn):
    return fn()

def takes(a, b):
    return a + b

def calls_nixl(agent):
    return agent.transfer(99)
'''


def _vllm(tmp_path):
    path = tmp_path / "vllm_stand_in.py"
    path.write_text(VLLM_CODE)
    spec = importlib.util.spec_from_file_location("vllm_stand_in", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _raised(fn):
    try:
        fn()
    except Exception as e:
        return e
    raise AssertionError("nothing raised")


def test_an_exception_in_the_drivers_code_is_a_harness_error_naming_its_line(tmp_path):
    vllm = _vllm(tmp_path)

    def patched():  # a driver patch of a vLLM method, called by vLLM
        return int(range(3))

    e = _raised(lambda: vllm.calls_back(patched))
    out = failure.outcome(e, "decode")
    assert out["status"] == "error", out
    assert "vllm-driver/test_failure.py:" in out["message"], out["message"]
    assert "vLLM frame: " in out["message"] and "vllm_stand_in.py" in out["message"], out["message"]


def test_a_call_vllm_rejects_for_its_arguments_is_a_harness_error(tmp_path):
    vllm = _vllm(tmp_path)
    e = _raised(lambda: vllm.takes(1, c=2))
    out = failure.outcome(e, "decode")
    assert out["status"] == "error", out
    assert "vLLM rejected the call the driver made at vllm-driver/test_failure.py:" in out["message"], out["message"]


def test_vllms_own_failure_stays_a_crash(tmp_path):
    vllm = _vllm(tmp_path)
    out = failure.outcome(_raised(vllm.own_bug), "prefill")
    assert (out["status"], out["side"]) == ("crashed", "prefill"), out
    # The driver's call path above it does not make it the driver's.
    out = failure.outcome(_raised(lambda: vllm.calls_back(vllm.own_bug)), "decode")
    assert out["status"] == "crashed", out


def test_the_nixl_stand_in_answering_vllm_stays_vllms(tmp_path):
    import fake_nixl

    vllm = _vllm(tmp_path)
    agent = fake_nixl.FakeNixlWrapper.__new__(fake_nixl.FakeNixlWrapper)
    agent.xfer_table = {}  # handle 99 was never made: the stand-in raises
    out = failure.outcome(_raised(lambda: vllm.calls_nixl(agent)), "decode")
    assert out["status"] == "crashed", out
