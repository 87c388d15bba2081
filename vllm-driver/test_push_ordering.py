"""Push on scheduler-made requests: the order of decode's two handshake
requests in one engine step.

vLLM's decode scheduler hands its workers, in one step, the request's push
registration and a heartbeat for prefill's engine. `start_load_kv` queues the
registration for the push writer thread (whose handshake is
notification-only) and then sends the heartbeats on the engine's own thread
(whose handshake, with one pipeline stage, is the full one). Whichever asks
first decides the handshake both share. The driver lets the writer thread
take the step's registrations before the heartbeats are sent; these tests
hold the writer back and check that the outcome stays the one of that order.

Run: `.vllm-venv/bin/python -m pytest vllm-driver/test_push_ordering.py`.
"""

import inspect
import os
import sys
import time

import pytest

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _push_refuses_different_block_sizes():
    """Whether the installed push worker refuses any P/D block-size
    difference at its handshake (0.34.0 and later): these cases then never
    reach the order this file is about."""
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl import push_worker

    return "identical P/D block sizes" in inspect.getsource(push_worker)


if _push_refuses_different_block_sizes():
    pytest.skip(
        "this vLLM's push refuses different P/D block sizes at the handshake; "
        "the ordering is tested on a release whose push accepts them (0.33.0)",
        allow_module_level=True,
    )

import test_scheduler_requests as sr  # noqa: E402
import test_scheduler_side as sched_tests  # noqa: E402


def _placed_run(tmp_path, spec):
    root = tmp_path / "sched"
    placed = sr.place(root, [spec])[spec["id"]]
    assert placed["status"] == "placed", placed
    full = sr.fill(root, spec, placed)
    (result,) = sr.run(root, [full])
    return result


def _slow_writer(monkeypatch, delay_s):
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.push_worker import NixlPushConnectorWorker

    send = NixlPushConnectorWorker._send_registration_to_p

    def late(self, *args, **kwargs):
        time.sleep(delay_s)
        return send(self, *args, **kwargs)

    monkeypatch.setattr(NixlPushConnectorWorker, "_send_registration_to_p", late)


def _slow_handshakes(monkeypatch, delay_s):
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.push_worker import NixlPushConnectorWorker

    handshake = NixlPushConnectorWorker._nixl_handshake

    def late(self, *args, **kwargs):
        time.sleep(delay_s)
        return handshake(self, *args, **kwargs)

    monkeypatch.setattr(NixlPushConnectorWorker, "_nixl_handshake", late)


def test_a_late_writer_still_takes_the_registration_first(tmp_path, monkeypatch):
    # Decode's blocks are half prefill's: decode's full handshake with
    # prefill raises, its notification-only one does not, and the receive
    # post-process then raises on the pushed request.
    # The writer comes late, while the heartbeat's handshake (if it asked
    # first) is still under way.
    _slow_writer(monkeypatch, 0.05)
    _slow_handshakes(monkeypatch, 0.5)
    spec = sr.case(sched_tests.attention_geometry(d_block=8, p_block=16, prefix_caching=False), 40, mode="push")
    result = _placed_run(tmp_path, spec)
    assert result["status"] == "crashed", (result["status"], result.get("message"))
    assert result["side"] == "decode"
    assert "divisible" in result["message"]
    decode = [h for h in result["handshakes"] if h["agent"] == "decode-0"]
    assert decode and all(h["ok"] and h["notif_only"] for h in decode), decode
