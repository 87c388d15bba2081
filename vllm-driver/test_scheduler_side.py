"""Tests of scheduler_side.py on vLLM's real scheduler, with answers worked
out by hand from the case (block counts and ids of a fresh pool), not read
back from vLLM.

Run: `.vllm-venv/bin/python -m pytest vllm-driver/test_scheduler_side.py`
(or the file itself: it then runs every test and exits 1 on a failure).
"""

import copy
import os
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import scheduler_side as side  # noqa: E402


def attention_geometry(d_block=16, p_block=16, prefix_caching=True):
    """Llama-style GQA: one attention group, D TP1, P TP2."""
    engine = {
        "kernel_block": 16,
        "num_logical_blocks": None,
        "layout": "HND",
        "host_buffer": False,
        "block_padding_bytes": 0,
    }
    return {
        "name": "test-gqa",
        "description": "",
        "model": {
            "attention": {"kind": "full", "total_kv_heads": 8, "head_size": 4, "dtype_bytes": 2},
            "mamba": None,
            "groups": ["attention"],
            "layer_slots": 2,
            "state_slots": None,
        },
        "prefill": {**engine, "tp_size": 2, "logical_block": p_block, "kernel_block": p_block, "prefix_caching": False},
        "decode": {**engine, "tp_size": 1, "logical_block": d_block, "kernel_block": d_block, "prefix_caching": prefix_caching},
        "prompts": None,
        "expect_rejection": None,
    }


def hybrid_geometry(block=16, prefix_caching=False):
    """MLA + one KDA group, both engines TP1, one logical block size."""
    engine = {
        "tp_size": 1,
        "kernel_block": block,
        "logical_block": block,
        "num_logical_blocks": None,
        "layout": "NHD",
        "host_buffer": False,
        "block_padding_bytes": 0,
    }
    return {
        "name": "test-mla-kda",
        "description": "",
        "model": {
            "attention": {"kind": "mla", "head_size": 6, "dtype_bytes": 2},
            "mamba": {
                "kind": "kda",
                "conv_dims": [2, 2, 4],
                "conv_rows": 3,
                "conv_dtype_bytes": 2,
                "ssm_state_bytes": 64,
                "n_groups": None,
            },
            "groups": ["attention", "mamba"],
            "layer_slots": 2,
            "state_slots": None,
        },
        "prefill": {**engine, "prefix_caching": False},
        "decode": {**engine, "prefix_caching": prefix_caching},
        "prompts": None,
        "expect_rejection": None,
    }


def case(geometry, prompt_len, prefix_hit=0, mode="pull"):
    return {"id": "t", "geometry": geometry, "prompt_len": prompt_len, "prefix_hit": prefix_hit, "mode": mode}


def test_attention_two_block_prefix_hit():
    # N = 40, B = 16 on both engines, a 32-token (2-block) hit on D.
    # Attention only: all 40 tokens are loaded, less the hit: 8.
    # D: ceil(40/16) = 3 blocks; the earlier request of 32 tokens took blocks
    # 1 and 2 of the fresh pool (0 is the null block) and left them cached,
    # so the request holds [1, 2] (hit) and the next free block, 3.
    # P: ceil(40/16) = 3 blocks, 1..3 of its own fresh pool.
    r = side.run_case(case(attention_geometry(), 40, 32))
    assert r["reachable"] is True, r
    d, p = r["decode"], r["prefill"]
    assert d["earlier_request"]["blocks"] == [[1, 2]]
    assert d["local_hit_tokens"] == 32
    assert r["tokens_to_transfer"] == 8
    assert d["load_async"] is True
    assert d["request_blocks"] == [[1, 2, 3]]
    assert d["transfer_blocks"] == [[3]]
    assert d["computed_blocks"] == [2]
    assert d["req_meta"]["remote"]["block_ids"] == [[1, 2, 3]]
    assert d["req_meta"]["remote"]["num_tokens"] == 40
    assert p["kv_transfer_params"]["remote_block_ids"] == [[1, 2, 3]]
    assert p["kv_transfer_params"]["remote_num_tokens"] == 40
    assert p["kv_transfer_params"]["tp_size"] == 2
    # A uniform-precision attention cache is never zeroed at allocation.
    assert d["zeroed_at_alloc"] == [] and p["zeroed_at_alloc"] == []


def test_attention_without_hit_and_unequal_blocks():
    # N = 33, D block 16: ceil(33/16) = 3 blocks, all transferred; P block 8:
    # ceil(33/8) = 5 blocks.
    r = side.run_case(case(attention_geometry(16, 8), 33))
    d, p = r["decode"], r["prefill"]
    assert r["tokens_to_transfer"] == 33
    assert d["request_blocks"] == [[1, 2, 3]] and d["transfer_blocks"] == [[1, 2, 3]]
    assert d["computed_blocks"] == [0]
    assert p["kv_transfer_params"]["remote_block_ids"] == [[1, 2, 3, 4, 5]]


def test_hybrid_transfers_all_but_the_last_token():
    # Mamba hybrid, N = 33, B = 16, no prefix caching: prefill computes and
    # decode loads N - 1 = 32 tokens (decode recomputes the last one).
    # Attention: ceil(32/16) = 2 blocks on each side; the mamba group one
    # state slot. P's attention blocks are new and zeroed at allocation (a
    # mamba hybrid zeroes new attention blocks); D's, written by the load,
    # are not.
    r = side.run_case(case(hybrid_geometry(), 33))
    d, p = r["decode"], r["prefill"]
    assert p["computed_tokens"] == 32
    assert r["tokens_to_transfer"] == 32
    assert d["request_blocks"] == [[1, 2], [3]]
    assert d["transfer_blocks"] == [[1, 2], [3]]
    assert p["kv_transfer_params"]["remote_block_ids"] == [[1, 2], [3]]
    assert p["zeroed_at_alloc"] == [1, 2]
    assert d["zeroed_at_alloc"] == []


def test_hybrid_prefix_hit_at_a_block_boundary():
    # Mamba hybrid with prefix caching on D, N = 40, hit 16: M = 39 tokens,
    # 23 loaded. Attention: ceil(39/16) = 3 blocks, 1 of them the hit.
    # The mamba group: one state slot to load, none counted as computed.
    r = side.run_case(case(hybrid_geometry(prefix_caching=True), 40, 16))
    assert r["reachable"] is True, r
    d = r["decode"]
    assert d["local_hit_tokens"] == 16
    assert r["tokens_to_transfer"] == 23
    held = [[b for b in g if b != 0] for g in d["request_blocks"]]
    assert [len(g) for g in held] == [3, 1]
    assert [len(g) for g in d["transfer_blocks"]] == [2, 1]
    assert d["computed_blocks"] == [1, 0]


def test_hits_that_are_not_whole_blocks_are_not_reachable():
    r = side.run_case(case(attention_geometry(), 40, 8))
    assert r["reachable"] is False and r["status"] == side.NOT_REACHABLE
    assert "whole decode blocks" in r["reason"]
    r = side.run_case(case(attention_geometry(prefix_caching=False), 40, 16))
    assert r["reachable"] is False and "prefix caching" in r["reason"]


def test_push_registers_the_transfer_blocks():
    # Push: decode registers its unhashed blocks with prefill; prefill hands
    # its finished blocks to its worker in the next step's metadata.
    r = side.run_case(case(attention_geometry(), 40, 32, mode="push"))
    d, p = r["decode"], r["prefill"]
    assert r["tokens_to_transfer"] == 8
    assert d["push_registration"]["local_block_ids"] == [[3]]
    assert d["transfer_blocks"] == [[3]]
    assert p["kv_transfer_params"]["transfer_mode"] == "push"
    assert list(p["next_meta"]["push_finished_blocks"].values()) == [[[1, 2, 3]]]


def test_a_reused_scheduler_answers_as_a_fresh_one():
    # Block ids do not depend on the cases run before: the pool is put back
    # as a fresh scheduler has it.
    g = attention_geometry()
    cases = [case(g, 40, 32), case(g, 50, 16), case(g, 7), case(g, 40, 32)]
    shared = side.Schedulers()
    reused = [side.run_case(c, shared) for c in cases]
    fresh = [side.run_case(c, side.Schedulers()) for c in cases]
    strip = lambda r: {k: v for k, v in r.items() if k != "seconds"}  # noqa: E731
    for a, b in zip(reused, fresh):
        a, b = copy.deepcopy(strip(a)), copy.deepcopy(strip(b))
        for r in (a, b):
            r["prefill"]["next_meta"].pop("scheduler_clock", None)
            r["prefill"]["next_meta"].pop("reqs_to_send", None)
        assert a == b
    assert shared.builds == 1


def test_batch_cost_is_measured_after_the_first_case():
    g = attention_geometry()
    results, cost = side.run_batch([case(g, n, 16) for n in (20, 30, 40)])
    assert [r.get("reachable") for r in results] == [True, True, True]
    assert cost["cases"] == 3 and cost["scheduler_builds"] == 1
    assert cost["mean_after_first_s"] is not None


if __name__ == "__main__":
    failed = 0
    for name, fn in sorted(globals().items()):
        if name.startswith("test_") and callable(fn):
            try:
                fn()
                print(f"ok   {name}")
            except Exception as e:  # report every test, then fail
                failed += 1
                print(f"FAIL {name}: {type(e).__name__}: {e}")
    sys.exit(1 if failed else 0)
