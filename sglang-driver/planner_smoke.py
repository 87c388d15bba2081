"""SGLang's heterogeneous-TP planner alone, on the NIXL stand-in.

    python planner_smoke.py [--heads 2] [--prefill-tp 1] [--decode-tp 4]

For SGLang releases the driver cannot build whole (api_check.py names what
they lack), the way SGLang's own CPU unit tests reach the planner: a
`NixlKVManager` made with `object.__new__`, given only what
`_init_hetero_tp_prep_handle` reads (attention TP, the KV args, a stand-in
agent holding the prefill rank's registered K/V buffers and each decode
rank's advertised regions), then called once per decode rank with a
`KVArgsRegisterInfo` built from that rank's buffers. The buffers are plain
host tensors `[slots x page, heads per rank, head_dim]` (SGLang's NHD
layout). Prints one JSON line: the lists prepared, the refusals (a #31295
planner overruns prefill's regions), and exit 1 when anything was refused.
Works on 0.5.16 (plain rows) and 0.5.23 (strided runs) alike.
"""

import argparse
import json
import os
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--prefill-tp", type=int, default=1)
    ap.add_argument("--decode-tp", type=int, default=4)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=8)
    ap.add_argument("--page", type=int, default=4)
    ap.add_argument("--slots", type=int, default=9)
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    import fake_nixl

    fake_nixl.install()
    import importlib.metadata as md
    import types

    import torch
    from sglang.srt.disaggregation.nixl import conn

    fabric = fake_nixl.new_fabric()
    elt = 2  # bfloat16

    def buffers(tp):
        heads = max(1, args.heads // tp)
        bufs = [torch.zeros(args.slots * args.page, heads, args.head_dim, dtype=torch.bfloat16)
                for _ in range(2 * args.layers)]
        item = args.page * heads * args.head_dim * elt
        return bufs, [b.data_ptr() for b in bufs], [b.numel() * elt for b in bufs], item

    pbufs, pptrs, plens, pitem = buffers(args.prefill_tp)
    fabric.pending_alias = "prefill-0"
    agent = fake_nixl.nixl_agent("prefill-0")
    agent.register_memory([(p, n, 0, "") for p, n in zip(pptrs, plens)], "VRAM")

    mgr = object.__new__(conn.NixlKVManager)
    mgr.attn_tp_size = args.prefill_tp
    mgr.agent = agent
    mgr.prep_handle_slice_src = None
    mgr.prep_handles_slice_dst = {}
    mgr._use_strided_descs = True
    mgr.pp_size = 1
    mgr.kv_args = types.SimpleNamespace(
        page_size=args.page, total_kv_head_num=args.heads, kv_head_num=max(1, args.heads // args.prefill_tp),
        engine_rank=0, gpu_id=0, kv_item_lens=[pitem] * len(pptrs), kv_data_ptrs=pptrs, kv_data_lens=plens,
        prefill_start_layer=0,
    )
    keep = [pbufs]
    raised = []
    for d in range(args.decode_tp):
        dbufs, dptrs, dlens, ditem = buffers(args.decode_tp)
        keep.append(dbufs)
        name = f"decode-{d}"
        fabric.pending_alias = name
        dagent = fake_nixl.nixl_agent(name)
        dagent.register_memory([(p, n, d, "") for p, n in zip(dptrs, dlens)], "VRAM")
        agent.add_remote_agent(dagent.get_agent_metadata())
        peer = types.SimpleNamespace(
            agent_name=name, decode_tp_size=args.decode_tp, decode_tp_rank=d, dst_kv_item_len=ditem,
            dst_kv_item_lens=[ditem] * len(dptrs), dst_kv_ptrs=dptrs, dst_num_slots=args.slots, gpu_id=d,
        )
        try:
            mgr._init_hetero_tp_prep_handle(name, peer, src_mem_kind="VRAM", dst_mem_kind="VRAM")
        except Exception as e:
            raised.append({"decode": name, "type": type(e).__name__, "message": str(e)})
            break
    print(json.dumps({
        "sglang": md.version("sglang"),
        "shape": vars(args),
        "lists": [{"target": x["target"], "rows": len(x["rows"]), "count": x["count"], "refused": x["refused"]}
                  for x in fabric.dlists],
        "refusals": [{k: r[k] for k in ("agent", "target", "row", "block", "reason")} for r in fabric.refusals],
        "raised": raised,
    }))
    return 1 if fabric.refusals or raised else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
