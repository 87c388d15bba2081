"""SGLang's own P/D transfer, driven on the CPU (case.py, driver.py).

Run: .sglang-venv/bin/python -m pytest sglang-driver/test_driver.py
(imports SGLang once, about 10 s; each case then takes well under 1 s).
"""

import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import inproc  # noqa: E402

# Watch every real bind/connect of this process before SGLang is imported.
NET = inproc.guard_network()

import case  # noqa: E402
import fake_nixl  # noqa: E402

NIXL_MODULE = "sglang.srt.disaggregation.nixl.conn"
GQA = {"attention": "mha", "layers": 2, "total_kv_heads": 2, "head_dim": 8}
P_PAGES = [3, 5, 6]
D_PAGES = [7, 2, 4]
PAGE = 4
PROMPT = 10  # 3 pages, the last one partly filled


def spec(prefill_tp, decode_tp, **extra):
    s = {
        "id": f"gqa-p{prefill_tp}-d{decode_tp}",
        "model": dict(GQA),
        "page_size": PAGE,
        "prompt_len": PROMPT,
        "prefill": {"tp_size": prefill_tp, "num_pages": 8, "request_pages": P_PAGES},
        "decode": {"tp_size": decode_tp, "num_pages": 8, "request_pages": D_PAGES},
    }
    s.update(extra)
    return s


@pytest.fixture(scope="module", autouse=True)
def sglang():
    import warnings

    warnings.filterwarnings("ignore")
    case.load()
    yield


RUNS = {}


def run(s):
    """A case's result and its Case (kept for its memory), once per id."""
    if s["id"] not in RUNS:
        RUNS[s["id"]] = case.run_case(s, keep=True)
    return RUNS[s["id"]]


def teardown_module(module):
    for _, c in RUNS.values():
        c.close()


def head_of(decode_rank, local_head, total_heads, decode_tp):
    """The model's KV head a decode rank holds at a local head: heads split
    evenly, or replicated rank // (tp / heads) when the TP exceeds them."""
    if decode_tp <= total_heads:
        return decode_rank * (total_heads // decode_tp) + local_head
    return decode_rank // (decode_tp // total_heads)


def check_bytes(s, c):
    """Every decode rank's request pages hold prefill's bytes of the same
    token and head; every other page still holds the sentinel 0x5A."""
    total = s["model"]["total_kv_heads"]
    ptp, dtp = s["prefill"]["tp_size"], s["decode"]["tp_size"]
    p_heads = max(1, total // ptp)
    for d in c.decode:
        d_heads = d.pool.head_num
        for region, view in enumerate(d.region_tensors()):
            dv = view.numpy().reshape(-1, PAGE, d_heads, s["model"]["head_dim"] * 2)
            for i, (pp, dp) in enumerate(zip(P_PAGES, D_PAGES)):
                for h in range(d_heads):
                    g = head_of(d.rank, h, total, dtp)
                    p = c.prefill[g // p_heads] if ptp <= total else c.prefill[g * (ptp // total)]
                    pv = p.region_tensors()[region].numpy().reshape(-1, PAGE, p.pool.head_num, dv.shape[-1])
                    assert np.array_equal(dv[dp, :, h], pv[pp, :, g % p_heads]), (d.name, region, dp, h)
            others = [n for n in range(dv.shape[0]) if n not in D_PAGES]
            assert (dv[others] == 0x5A).all(), f"{d.name} region {region}: a page outside the request was written"


def test_mha_equal_tp_bytes_land():
    s = spec(1, 1, model={"attention": "mha", "layers": 2, "total_kv_heads": 2, "head_dim": 8})
    s["id"] = "mha-p1-d1"
    result, c = run(s)
    assert result["status"] == "done", result["message"]
    check_bytes(s, c)
    # One prepared WRITE of 3 pages x 4 regions, then the aux rows.
    kinds = [(x["kind"], len(x["local_ids"])) for x in result["xfers"]]
    assert kinds[0] == ("prepped", 12)
    assert result["refusals"] == []


def test_gqa_prefill_tp1_into_decode_tp4():
    """Two KV heads, prefill attention TP1 -> decode TP4: the #31295 shape
    (fixed in 0.5.23 by PR #31968): each head goes to two decode ranks."""
    s = spec(1, 4)
    result, c = run(s)
    assert result["status"] == "done", result["message"]
    assert result["refusals"] == []
    check_bytes(s, c)
    assert {r["required_dst_info_num"] for r in result["rank_mapping"].values()} == {4}


def test_gqa_prefill_tp2_into_decode_tp1():
    s = spec(2, 1)
    result, c = run(s)
    assert result["status"] == "done", result["message"]
    check_bytes(s, c)


def test_every_transfer_was_posted_by_a_transfer_worker_of_sglangs_nixl_module():
    for s in (spec(1, 4), spec(2, 1)):
        result, _ = run(s)
        assert result["xfers"], "no transfer"
        for x in result["xfers"]:
            assert x["posted"], x
            by = x["posted_by"]
            assert by["sglang"]["module"] == NIXL_MODULE, by
            assert by["thread_runs"] == "transfer_worker" and by["thread_runs_module"] == NIXL_MODULE, by
            assert "transfer_worker" in by["thread"], by
            assert x["made_by"]["thread"] == by["thread"], "made and posted on different threads"
        for d in result["dlists"]:
            assert d["made_by"]["sglang"]["module"] == NIXL_MODULE, d["made_by"]
            # Peer setup runs on prefill's bootstrap thread, sends on transfer workers.
            assert d["made_by"]["thread_runs"] in ("bootstrap_thread_guarded", "transfer_worker"), d["made_by"]


def test_out_of_region_descriptors_through_sglang_are_refused(monkeypatch):
    """Decode advertises twice its real slot count: prefill's own planning
    then prepares a destination list past decode's registered regions, which
    NIXL (and the stand-in) refuses at prep time; nothing is written."""
    nixl = case.S["nixl_conn"]
    real = nixl.NixlKVManager.build_receiver_registration_message

    def inflated(self):
        frames = real(self)
        frames[17] = str(int(frames[17].decode()) * 2).encode()  # dst_num_slots
        return frames

    monkeypatch.setattr(nixl.NixlKVManager, "build_receiver_registration_message", inflated)
    s = spec(1, 1)
    s["id"] = "inflated-slots"
    result, c = case.run_case(s, keep=True, timeout_s=5)
    try:
        assert result["status"] == "crashed", result
        assert "NIXL_ERR_NOT_FOUND" in result["message"]
        refusal = result["refusals"][0]
        assert refusal["target"] == "decode-0" and refusal["agent"] == "prefill-0"
        assert refusal["caller"]["sglang"]["function"] == "_prep_xfer_dlist"
        assert "_prepare_payload_xfer" in refusal["caller"]["chain"]
        assert not any(x["posted"] for x in result["xfers"])
        for view in c.decode[0].region_tensors():
            assert (view.numpy() == 0x5A).all()
    finally:
        c.close()


def test_page_size_mismatch_is_rejected_by_sglang():
    s = spec(1, 1)
    s["id"] = "page-mismatch"
    s["decode"] = dict(s["decode"], page_size=8)
    result, c = run(s)
    assert result["status"] == "rejected"
    assert "Page size mismatch" in result["message"]


def test_nothing_leaves_loopback():
    for s in (spec(1, 4), spec(2, 1)):
        result, _ = run(s)
        ctl = result["control"]
        assert ctl["addresses"], "no address was recorded"
        assert {a["host"] for a in ctl["addresses"]} == {"127.0.0.1"}
        assert {row["rank_ip"] for row in ctl["bootstrap_rows"]} == {"127.0.0.1"}
        assert all("//127.0.0.1:" in h["url"] for h in ctl["http"])
    # No real socket was bound or connected outside loopback in this process.
    for entry in NET:
        if entry["kind"].startswith("zmq"):
            assert not entry["address"].startswith("tcp://") or "//127.0.0.1:" in entry["address"], entry
        else:
            assert entry["host"] in ("127.0.0.1", "::1", "localhost") or isinstance(entry["host"], str) and entry[
                "host"].startswith("/"), entry
    # And an attempt is refused, by SGLang's transport and by the guard.
    with pytest.raises(inproc.LeftLoopback):
        inproc.Hub().note("connect", "10.1.2.3", 5555)
    with pytest.raises(inproc.LeftLoopback):
        socket.socket().connect(("10.255.255.1", 9))


def test_api_check_names_a_removed_method(monkeypatch, capsys):
    import api_check

    assert api_check.main() == 0
    capsys.readouterr()
    monkeypatch.delattr(case.S["nixl_conn"].NixlKVManager, "send_kvcache_slice")
    monkeypatch.delattr(case.S["common_conn"].CommonKVManager, "try_ensure_parallel_info")
    monkeypatch.delattr(case.S["runtime_context"], "SpawnRanks")
    assert api_check.main() == 2
    err = capsys.readouterr().err
    assert "NixlKVManager.send_kvcache_slice (the head-slice send path)" in err
    assert "CommonKVManager.try_ensure_parallel_info" in err
    assert "sglang.srt.runtime_context.SpawnRanks (each rank's world rank and GPU id)" in err


def test_api_check_names_an_agent_method_the_stand_in_lacks(monkeypatch, capsys):
    import api_check

    monkeypatch.delattr(fake_nixl.nixl_agent, "initialize_xfer")
    assert api_check.main() == 2
    assert "self.agent.initialize_xfer()" in capsys.readouterr().err


def test_driver_runs_a_batch(tmp_path):
    batch = {
        "format": "kvgeom-sglang-batch/1",
        "case_timeout_s": 10,
        "cases": [spec(1, 2), dict(spec(1, 1), id="mismatch", decode={**spec(1, 1)["decode"], "page_size": 8})],
    }
    (tmp_path / "batch.json").write_text(json.dumps(batch))
    proc = subprocess.run([sys.executable, os.path.join(HERE, "driver.py"), str(tmp_path)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"gqa-p1-d2": "done", "mismatch": "rejected"}
    result = json.loads((tmp_path / "gqa-p1-d2" / "result.json").read_text())
    assert result["format"] == "kvgeom-sglang-result/1" and result["sglang"] == "0.5.23"
    for agent in ("prefill-0", "decode-0", "decode-1"):
        for region in range(4):
            out = tmp_path / "gqa-p1-d2" / f"{agent}.r{region}.out"
            assert out.stat().st_size == result["agents"][agent]["regions"][region]["len"]


def decode_writes(result):
    """Per destination descriptor (agent, addr, len) of decode memory, the
    prefill agents whose posted transfers wrote it."""
    lists = {(d["agent"], d["handle"]): d for d in result["dlists"]}
    out = {}
    for x in result["xfers"]:
        if not x["posted"]:
            continue
        d = lists[(x["agent"], x["remote"])]
        starts, n = [], 0
        for r in d["rows"]:
            starts.append(n)
            n += r[4] if len(r) == 5 else 1
        for ri in x["remote_ids"]:
            k = max(i for i, s in enumerate(starts) if s <= ri)
            r = d["rows"][k]
            addr = r[0] + (ri - starts[k]) * (r[3] if len(r) == 5 else 0)
            out.setdefault((x["peer"], addr, r[1]), []).append(x["agent"])
    return out


def test_observed_replicated_prefill_ranks_each_write_the_decode_head():
    """0.5.23, observed: prefill attention TP 4 over 2 KV heads into decode
    TP 1. Both replicas of each head are real senders and write the same
    decode bytes (README, "Observed"): the bytes are right (the replicas
    hold the same head), but every KV descriptor of decode is written twice,
    by two prefill ranks. A fix (one writer per head) makes this test fail."""
    s = spec(4, 1)
    result, c = run(s)
    assert result["status"] == "done", result["message"]
    check_bytes(s, c)
    kv = {k: v for k, v in decode_writes(result).items() if k[2] == 2 * s["model"]["head_dim"]}
    assert kv and all(sorted(v) in (["prefill-0", "prefill-1"], ["prefill-2", "prefill-3"]) for v in kv.values())


def v_spec(prefill_tp, decode_tp, v_head_dim):
    s = spec(prefill_tp, decode_tp, model=dict(GQA, v_head_dim=v_head_dim))
    s["id"] = f"v{v_head_dim}-p{prefill_tp}-d{decode_tp}"
    return s


def v_mismatches(s, c):
    """(page, head) slices of decode's V regions that differ from prefill's."""
    layers, total = s["model"]["layers"], s["model"]["total_kv_heads"]
    width = s["model"]["v_head_dim"] * 2
    ptp, dtp = s["prefill"]["tp_size"], s["decode"]["tp_size"]
    p_heads = max(1, total // ptp)
    bad = 0
    for d in c.decode:
        for region, view in enumerate(d.region_tensors()):
            if region < layers:
                continue
            dv = view.numpy().reshape(-1, PAGE, d.pool.head_num, width)
            for pp, dp in zip(P_PAGES, D_PAGES):
                for h in range(d.pool.head_num):
                    g = head_of(d.rank, h, total, dtp)
                    p = c.prefill[g // p_heads]
                    pv = p.region_tensors()[region].numpy().reshape(-1, PAGE, p.pool.head_num, width)
                    bad += not np.array_equal(dv[dp, :, h], pv[pp, :, g % p_heads])
    return bad


def test_observed_v_head_dim_is_ignored_on_the_head_slice_path():
    """0.5.23, observed (candidate 3 of the notes): with v_head_dim !=
    head_dim and different attention TP, _init_hetero_tp_prep_handle sizes
    the V runs with K's geometry. A smaller V runs past prefill's V regions
    (refused at prep, as NIXL would: the bootstrap thread dies); a larger V
    is accepted and decode's V pages end up wrong, silently. Equal TP is
    right. A fix makes this test fail."""
    equal = v_spec(1, 1, 16)
    result, c = run(equal)
    assert result["status"] == "done" and v_mismatches(equal, c) == 0

    smaller = v_spec(1, 2, 4)
    result, c = run(smaller)
    assert result["status"] == "crashed"
    assert "NIXL_ERR_NOT_FOUND" in result["message"] and "_init_hetero_tp_prep_handle" in result["refusals"][0][
        "caller"]["chain"]

    larger = v_spec(1, 2, 16)
    result, c = run(larger)
    assert result["status"] == "done"
    assert v_mismatches(larger, c) > 0


def test_a_room_that_never_bootstraps_is_hung(monkeypatch):
    """Decode's per-request frames are never sent: prefill's room stays
    Bootstrapping, nothing raised, so the case is hung after its time-out."""
    monkeypatch.setattr(case.S["common_conn"].CommonKVReceiver, "send_metadata", lambda self, *a, **k: None)
    s = spec(1, 1)
    s["id"] = "no-metadata"
    result, c = case.run_case(s, keep=True, timeout_s=1)
    try:
        assert result["status"] == "hung", result
        assert "Bootstrapping" in result["message"]
        assert result["xfers"] == []
    finally:
        c.close()


def test_mla_prefill_tp2_into_decode_tp1():
    """The latent is replicated on every prefill rank; one is the real
    sender, the other a dummy target that still reports Success."""
    s = {
        "id": "mla-p2-d1",
        "model": {"attention": "mla", "layers": 2, "kv_lora_rank": 16, "qk_rope_head_dim": 8},
        "page_size": PAGE,
        "prompt_len": PROMPT,
        "prefill": {"tp_size": 2, "num_pages": 8, "request_pages": P_PAGES},
        "decode": {"tp_size": 1, "num_pages": 8, "request_pages": D_PAGES},
    }
    result, c = run(s)
    assert result["status"] == "done", result["message"]
    assert {x["agent"] for x in result["xfers"]} == {"prefill-0"}
    assert result["agents"]["prefill-1"]["poll"] == "Success"
    for region, view in enumerate(c.decode[0].region_tensors()):
        dv = view.numpy().reshape(9, -1)  # 8 pages and SGLang's padding page 0
        pv = c.prefill[0].region_tensors()[region].numpy().reshape(9, -1)
        for pp, dp in zip(P_PAGES, D_PAGES):
            assert np.array_equal(dv[dp], pv[pp])
        assert (dv[[n for n in range(9) if n not in D_PAGES]] == 0x5A).all()


ROOT = os.path.dirname(HERE)


def smoke(python, *args):
    proc = subprocess.run([python, os.path.join(HERE, "planner_smoke.py"), *args], capture_output=True, text=True,
                          timeout=300)
    return proc.returncode, json.loads(proc.stdout.strip().splitlines()[-1])


def test_planner_smoke_accepts_the_31295_shape_on_this_sglang():
    rc, out = smoke(sys.executable)
    assert rc == 0 and out["refusals"] == [], out
    assert [x["count"] for x in out["lists"]] == [288, 144, 144, 144, 144]  # 2 unique head groups


@pytest.mark.skipif(not os.path.exists(os.path.join(ROOT, ".sglang-venvs", "0.5.16", "bin", "python")),
                    reason="no .sglang-venvs/0.5.16 (scripts/install-sglang.sh --version 0.5.16)")
def test_planner_smoke_reproduces_31295_on_0_5_16():
    """SGLang 0.5.16, before PR #31968: 2 KV heads, prefill attention TP1,
    decode TP4; the source list interleaves 4 head groups over 2 heads and
    runs past prefill's regions: refused at prep, as NIXL_ERR_NOT_FOUND was
    in the issue."""
    rc, out = smoke(os.path.join(ROOT, ".sglang-venvs", "0.5.16", "bin", "python"))
    assert out["sglang"] == "0.5.16"
    assert rc == 1 and out["refusals"][0]["target"] == "local", out
    assert "NIXL_ERR_NOT_FOUND" in out["raised"][0]["message"]
    assert out["lists"][0]["count"] == 576  # 4 head groups where 2 exist: twice the 288 that fit
