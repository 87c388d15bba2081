#!/usr/bin/env python3
"""The true verdicts of v1 traces (`vllm-nixl-geometry-trace/1`), computed
from the desc ids alone, independently of kvgeom.

Usage: scripts/v1-trace-truth.py [--manifest] [--detail] FILE_OR_DIR ...

For each `*.jsonl` / `*.jsonl.gz` file: every transfer pair's local row and
remote row are looked up in their prepared lists by desc id and mapped to
(region, block, token start) from the addresses alone:

- local rows: the regions of `register_memory`, in the order of the
  worker's `local_base_addrs`; block lengths and strides from
  `local_geometry`;
- remote rows: the `kv_caches_base_addr` of the handshake whose agent the
  list targets (each region runs to the next base), `block_lens` /
  `block_strides` from that metadata;
- a row is attention when the strided run it comes from steps by less than
  a logical page (or, at one kernel block per logical block, spans the
  whole block), mamba state otherwise;
- an attention row's token start: decode kernel block `b` at position `j`
  of the attention group's `local_physical_block_ids` holds tokens from
  `(local_num_computed_blocks * ppl + j) * kernel` (the prefix hit comes
  first, not in the request); prefill kernel block `b` of logical block
  `b // ppl` at position `i` of `remote_block_ids` holds tokens from
  `i * logical + (b % ppl) * kernel`; a row starting inside a block adds
  its offset over the bytes of one token.

Violations: an attention pair whose decode token start differs from
prefill's (misaligned), pairs of different lengths or kinds, a pair
writing outside the request's blocks (attention: the group's kernel
blocks after the prefix hit; mamba: the request's state blocks) or reading
outside prefill's, a state part (conv sub-projection or temporal state: the
place of the row's run among its list's state runs of that region) filled
from another part, two pairs writing the same bytes, decode tokens
between the prefix hit and the transferred tokens that no pair fills, and
a mamba state block not filled whole.

The verdict per file: check-trace `passed` or `violations`; diff-trace
`--policy vllm-0.33.0` `match` (every file here is recorded from vLLM
0.33.0, whose behaviour that policy reproduces). A trace whose attention is
not MLA (GQA: kvgeom's v1 reader has no layout model for it) is `refused`
(reason class `gqa`); one whose handshake vLLM refused is `rejected`, or,
when the trace holds no request (vLLM refused before any read), `refused`
(reason class `handshake`: a v1 trace does not carry all the handshake
checked, decode's prefix caching among it).
Only the standard library is used.
"""

import gzip
import json
import os
import sys


def read_events(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


class Bad(Exception):
    pass


def expand(strided):
    """Rows (addr, len, run) of a list's strided runs; desc ids index them."""
    rows = []
    for k, (addr, length, _dev, stride, count) in enumerate(strided):
        for i in range(count):
            rows.append((addr + i * stride, length, k))
    return rows


def region_of(bases, ends, addr):
    for i, (b, e) in enumerate(zip(bases, ends)):
        if b <= addr < e:
            return i
    raise Bad(f"address {addr:#x} lies in no region")


def is_attention(run, page, block_len, block_stride):
    """A run of attention blocks steps by less than a logical page (ppl > 1,
    or a list split for a smaller remote kernel block); at ppl 1 it steps by
    the page and spans a whole kernel block, which a state row never does."""
    stride, length = run[3], run[1]
    return stride < page or (page == block_stride and length >= block_len)


def state_part(dlist, k, bases, ends, strides, ppl, lens):
    """Which part of a mamba state (conv sub-projections, then the temporal
    state) run `k` of a list holds: its place among the list's state runs
    of the same region."""
    runs = dlist["strided"]
    reg = region_of(bases, ends, runs[k][0])
    page = ppl * strides[reg]
    part = 0
    for i in range(k):
        r = runs[i]
        if region_of(bases, ends, r[0]) == reg and not is_attention(r, page, lens[reg], strides[reg]):
            part += 1
    return part


def group_kinds(params, geo, phys, logical, ppl_d, num_groups):
    """Which KV-cache groups are attention: `meta.params.groups` when the
    trace names them, all of them without mamba, else the groups whose
    kernel ids expand their logical ids."""
    kinds = params.get("groups")
    if kinds:
        return ["attention" if k == "attention" else "mamba" for k in kinds]
    if not geo.get("_has_mamba"):
        return ["attention"] * num_groups
    if ppl_d <= 1:
        raise Bad("cannot tell attention groups from mamba groups (ppl 1 and no meta.params.groups)")
    return [
        "attention" if len(phys[g]) == ppl_d * len(logical[g]) and len(logical[g]) else "mamba"
        for g in range(num_groups)
    ]


def judge(path):
    events = read_events(path)
    by = {}
    for e in events:
        by.setdefault(e["ev"], []).append(e)
    meta = by["meta"][0]
    params = meta.get("params", {})
    geo_ev = by.get("local_geometry", [None])[0]
    if geo_ev is None or geo_ev.get("geometry") is None:
        raise Bad("no local geometry")
    geo = geo_ev["geometry"]
    remotes = by.get("add_remote_agent", [])
    if any(r.get("exception") for r in remotes):
        if not by.get("request"):
            # vLLM refused the handshake before any read: the trace holds no
            # request, and nothing of what the handshake checked beyond it
            # (decode's prefix caching is not in a v1 trace).
            return {
                "check": "refused",
                "diff": "refused",
                "reason": "vLLM refused the handshake and the trace holds no request: "
                + remotes[-1]["exception"],
                "reason_class": "handshake",
            }
        return {"check": "rejected", "diff": "match", "reason": remotes[-1]["exception"]}
    if not geo["use_mla"]:
        return {
            "check": "refused",
            "diff": "refused",
            "reason_class": "gqa",
            "reason": "attention is not MLA: kvgeom's v1 reader has no layout model for GQA",
        }
    if params.get("mode", "pull") != "pull" or not by.get("request"):
        raise Bad("not a pull trace with a request")

    # Local regions, in region-index order.
    rank_key = str(geo["tp_rank"])
    local_bases = geo["local_base_addrs"].get(rank_key) or next(iter(geo["local_base_addrs"].values()))
    registered = by["register_memory"][0]["regions"]
    local_ends = []
    for b in local_bases:
        r = next((r for r in registered if r[0] == b), None)
        if r is None:
            raise Bad(f"region base {b:#x} not registered")
        local_ends.append(b + r[1])
    l_len = geo["block_len_per_layer"]
    l_stride = geo["block_stride_per_layer"]
    ppl_d = geo["_physical_blocks_per_logical_kv_block"]
    kernel_d = geo["block_size"]

    remote_by_name = {}
    for r in remotes:
        m = r["remote_meta"]
        bases = m["kv_caches_base_addr"]
        order = sorted(bases)
        ends = []
        for b in bases:
            later = [x for x in order if x > b]
            ends.append(later[0] if later else 1 << 64)
        remote_by_name[r["result"]] = (m, bases, ends)

    lists = {}
    for d in by.get("dlist", []):
        lists[d["handle"]] = d

    req = by["request"][0]
    logical = req["local_block_ids"]
    phys = req["local_physical_block_ids"]
    computed = req.get("local_num_computed_blocks") or [0] * len(logical)
    remote_ids = req["remote_block_ids"]
    kinds = group_kinds(params, geo, phys, logical, ppl_d, len(logical))
    attn_groups = [g for g, k in enumerate(kinds) if k == "attention"]
    mamba_groups = [g for g, k in enumerate(kinds) if k == "mamba"]
    matched = req["matched_tokens"]
    block_d = ppl_d * kernel_d

    # Decode kernel block -> (group, token start); prefill logical -> position.
    d_token = {}
    for g in attn_groups:
        for j, b in enumerate(phys[g]):
            d_token[b] = (g, (computed[g] * ppl_d + j) * kernel_d)
    d_state = {b: g for g in mamba_groups for b in logical[g]}

    findings = []
    pairs = misaligned = 0
    written = {}  # local region -> [(offset, len)]
    attn_cover = {}  # (region, group) -> [(token start, tokens)]
    state_fill = {}  # (region, group, block) -> bytes
    for x in by.get("xfer", []):
        local = lists.get(x["local_handle"])
        remote = lists.get(x["remote_handle"])
        if local is None or remote is None:
            raise Bad(f"xfer {x['handle']}: unknown list")
        if remote["target"] not in remote_by_name:
            raise Bad(f"xfer {x['handle']}: list {remote['handle']} targets no handshake")
        m, r_bases, r_ends = remote_by_name[remote["target"]]
        ppl_p = m["physical_blocks_per_logical_kv_block"]
        kernel_p = m["block_size"]
        block_p = ppl_p * kernel_p
        r_len = m["block_lens"]
        r_stride = m.get("block_strides") or r_len
        l_rows = expand(local["strided"])
        r_rows = expand(remote["strided"])
        l_runs = local["strided"]
        r_runs = remote["strided"]
        if len(x["local_ids"]) != len(x["remote_ids"]):
            findings.append(f"xfer {x['handle']}: {len(x['local_ids'])} local ids, {len(x['remote_ids'])} remote")
        for i, (li, ri) in enumerate(zip(x["local_ids"], x["remote_ids"])):
            pairs += 1
            where = f"xfer {x['handle']} pair {i}"
            if not (0 <= li < len(l_rows) and 0 <= ri < len(r_rows)):
                findings.append(f"{where}: desc id outside its list")
                continue
            la, ll, lk = l_rows[li]
            ra, rl, rk = r_rows[ri]
            lreg = region_of(local_bases, local_ends, la)
            rreg = region_of(r_bases, r_ends, ra)
            loff = la - local_bases[lreg]
            roff = ra - r_bases[rreg]
            if loff + ll > local_ends[lreg] - local_bases[lreg]:
                findings.append(f"{where}: local row ends past its region")
            if ll != rl:
                findings.append(f"{where}: local {ll} bytes, remote {rl}")
            for o, n in written.setdefault(lreg, []):
                if loff < o + n and o < loff + ll:
                    findings.append(f"{where}: writes bytes another pair wrote (region {lreg} +{loff})")
                    break
            written[lreg].append((loff, ll))
            l_page = ppl_d * l_stride[lreg]
            r_page = ppl_p * r_stride[rreg]
            l_attn = is_attention(l_runs[lk], l_page, l_len[lreg], l_stride[lreg])
            r_attn = is_attention(r_runs[rk], r_page, r_len[rreg], r_stride[rreg])
            if l_attn != r_attn:
                findings.append(f"{where}: local row is {'attention' if l_attn else 'state'}, remote row is not")
                continue
            if l_attn:
                kb = loff // l_stride[lreg]
                l_tok_bytes = l_len[lreg] // kernel_d
                if kb not in d_token:
                    findings.append(f"{where}: writes decode kernel block {kb}, not one of the request's")
                    continue
                g, start = d_token[kb]
                d_start = start + (loff % l_stride[lreg]) // l_tok_bytes
                pkb = roff // r_stride[rreg]
                r_tok_bytes = r_len[rreg] // kernel_p
                pl = pkb // ppl_p
                if pl not in remote_ids[g]:
                    findings.append(f"{where}: reads prefill block {pl}, not one of the request's")
                    continue
                p_start = remote_ids[g].index(pl) * block_p + (pkb % ppl_p) * kernel_p + (roff % r_stride[rreg]) // r_tok_bytes
                if d_start != p_start:
                    misaligned += 1
                    findings.append(
                        f"{where}: misaligned: decode region {lreg} block {kb} tokens from {d_start} "
                        f"receive prefill tokens from {p_start}"
                    )
                attn_cover.setdefault((lreg, g), []).append((d_start, ll // l_tok_bytes))
            else:
                lb = loff // l_page
                pb = roff // r_page
                g = d_state.get(lb)
                if g is None:
                    findings.append(f"{where}: writes decode state block {lb}, not one of the request's")
                    continue
                if pb not in remote_ids[g]:
                    findings.append(f"{where}: reads prefill state block {pb}, not group {g}'s")
                    continue
                lj = state_part(local, lk, local_bases, local_ends, l_stride, ppl_d, l_len)
                rj = state_part(remote, rk, r_bases, r_ends, r_stride, ppl_p, r_len)
                if lj != rj:
                    findings.append(f"{where}: decode state part {lj} receives prefill state part {rj}")
                key = (lreg, g, lb)
                state_fill[key] = state_fill.get(key, 0) + ll

    # Coverage: every decode token after the prefix hit, up to the
    # transferred tokens, filled in every region holding attention.
    ssm_regions = set(geo.get("_ssm_region_indices") or [])
    for g in attn_groups:
        hit = computed[g] * block_d
        if matched is None or hit >= matched:
            continue
        for reg in range(len(local_bases)):
            filled = sorted(attn_cover.get((reg, g), []))
            at = hit
            for s, n in filled:
                if s > at:
                    break
                at = max(at, s + n)
            if at < matched:
                findings.append(f"coverage: region {reg} group {g}: decode tokens {at}..{matched} not transferred")
    state_bytes = sum(geo.get("_mamba_ssm_size") or [])
    for g in mamba_groups:
        for lb in logical[g]:
            for reg in sorted(ssm_regions):
                got = state_fill.get((reg, g, lb), 0)
                if got != state_bytes:
                    findings.append(f"coverage: region {reg} state block {lb} (group {g}): {got} of {state_bytes} bytes")

    return {
        "check": "violations" if findings else "passed",
        "diff": "match",
        "pairs": pairs,
        "misaligned": misaligned,
        "findings": findings,
    }


def files_of(args):
    out = []
    for a in args:
        if os.path.isdir(a):
            for root, _, names in os.walk(a):
                out += [os.path.join(root, n) for n in names if n.endswith((".jsonl", ".jsonl.gz"))]
        else:
            out.append(a)
    return sorted(out)


def main(argv):
    args = [a for a in argv[1:] if not a.startswith("--")]
    flags = {a for a in argv[1:] if a.startswith("--")}
    unknown = flags - {"--manifest", "--detail"}
    if unknown or not args:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    results = {}
    status = 0
    for path in files_of(args):
        try:
            results[path] = judge(path)
        except Exception as e:  # any malformed file is that file's error, named

            results[path] = {"check": "error", "diff": "error", "reason": f"{type(e).__name__}: {e}"}
            status = 1
    if "--manifest" in flags:
        manifest = {}
        for path, r in results.items():
            entry = {"check": r["check"], "diff": r["diff"]}
            for k in ("reason_class", "reason", "misaligned", "pairs"):
                if k in r:
                    entry[k] = r[k]
            manifest[os.path.normpath(path)] = entry
        json.dump(manifest, sys.stdout, indent=1, sort_keys=True)
        print()
    else:
        for path, r in results.items():
            extra = f" ({r['misaligned']} of {r['pairs']} pairs misaligned)" if r.get("misaligned") else ""
            why = f" [{r.get('reason_class', '')}{': ' if r.get('reason_class') else ''}{r['reason']}]" if "reason" in r else ""
            print(f"{path}: check-trace {r['check']}{extra}; diff-trace {r['diff']}{why}")
            if "--detail" in flags:
                for f in r.get("findings", [])[:20]:
                    print(f"  {f}")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv))
