"""A NIXL stand-in for SGLang's NIXL KV manager (sglang.srt.disaggregation.nixl.conn).

It serves the agent surface SGLang 0.5.23 calls (`nixl._api.nixl_agent`,
`nixl_agent_config`, `nixl_thread_sync_t`, and the error classes SGLang imports
from `nixl._bindings`), moves the bytes each transfer names between host
memory by address, and records everything:

- every registration (the regions of each agent, with memory kind and device);
- every prepared descriptor list, as SGLang handed it over (strided rows
  `(addr, len, dev, stride, count)` or plain rows `(addr, len, dev)`), kept
  lazy: a run of `count` blocks is never expanded, desc id `i` is resolved by
  a search over the runs' cumulative counts;
- every transfer (prepared or from `initialize_xfer`), its desc ids, whether
  it was posted, and who made and who posted it: the innermost SGLang
  function on the stack (module, function, line), the SGLang function the
  thread runs at its bottom (e.g. `transfer_worker`) and the thread's name.

Like real NIXL it refuses a descriptor that lies outside every region its
agent registered (local lists) or that the peer's metadata advertises
(remote lists), at `prep_xfer_dlist` and at `initialize_xfer`, with
`nixlNotFoundError` ("NIXL_ERR_NOT_FOUND"); it refuses a prepared transfer
whose desc ids are out of range or whose paired lengths differ
(`nixlInvalidParamError`). A refused list is recorded with `refused` and the
reason, so the out-of-region rows can be named afterwards.
"""

import bisect
import ctypes
import enum
import itertools
import json
import sys
import threading
import types

import numpy as np

SGLANG_PREFIX = "sglang."


# -- the error classes real NIXL raises (nixl._bindings) --
class nixlError(RuntimeError):
    pass


class nixlNotFoundError(nixlError):
    pass


class nixlInvalidParamError(nixlError):
    pass


class nixlBackendError(nixlError):
    pass


class nixlCancelledError(nixlError):
    pass


class nixlRemoteDisconnectError(nixlError):
    pass


class nixl_thread_sync_t(enum.Enum):
    NIXL_THREAD_SYNC_NONE = 0
    NIXL_THREAD_SYNC_STRICT = 1
    NIXL_THREAD_SYNC_RW = 2
    NIXL_THREAD_SYNC_DEFAULT = 3


class nixl_agent_config:
    def __init__(self, *args, **kwargs):
        self.args = args
        self.kwargs = kwargs


def who_called():
    """Where the stand-in was called from: the innermost SGLang frame
    (module, function, line), the outermost SGLang function of this thread
    (what the thread runs, e.g. `transfer_worker`), and the thread's name."""
    frame = sys._getframe(1)
    inner = None
    outer = None
    chain = []
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module.startswith(SGLANG_PREFIX):
            where = {"module": module, "function": frame.f_code.co_name, "line": frame.f_lineno}
            if inner is None:
                inner = where
            outer = where
            chain.append(frame.f_code.co_name)
        frame = frame.f_back
    return {
        "sglang": inner,
        "thread_runs": outer["function"] if outer else None,
        "thread_runs_module": outer["module"] if outer else None,
        "chain": list(reversed(chain)),
        "thread": threading.current_thread().name,
    }


class Runs:
    """A descriptor list as SGLang gave it: strided runs (plain rows are runs
    of one block), resolved lazily."""

    def __init__(self, rows):
        arr = np.asarray(rows, dtype=np.uint64)
        if arr.size == 0:
            arr = arr.reshape(0, 3)
        if arr.ndim != 2 or arr.shape[1] not in (3, 5):
            raise TypeError(f"descriptor rows must be Nx3 or Nx5, got shape {arr.shape}")
        self.strided = arr.shape[1] == 5
        self.rows = [tuple(int(x) for x in r) for r in arr.tolist()]
        self.starts = []  # desc id of each run's first block
        n = 0
        for r in self.rows:
            self.starts.append(n)
            n += r[4] if self.strided else 1
        self.count = n

    def runs(self):
        """(addr, len, dev, stride, count) of every run."""
        for r in self.rows:
            yield r if self.strided else (r[0], r[1], r[2], r[1], 1)

    def desc(self, i):
        """(addr, len, dev) of desc id i."""
        if not 0 <= i < self.count:
            raise IndexError(i)
        if not self.strided:
            return self.rows[i]
        k = bisect.bisect_right(self.starts, i) - 1
        addr, length, dev, stride, _ = self.rows[k]
        return addr + (i - self.starts[k]) * stride, length, dev

    def as_json(self):
        return [list(r) for r in self.rows]


def uncovered(run, regions):
    """The first block of a strided run that lies outside the region holding
    its first block (None when the whole run lies in one region). Like NIXL
    1.5.1, a run must lie in ONE registered region as a whole: a run whose
    blocks are each inside some region, but in two adjacent ones, is refused
    too (nixl_probe.py checks this against real NIXL). `regions`: (addr,
    len, dev) of the matching memory kind. Constant work per region, however
    many blocks the run has."""
    addr, length, dev, stride, count = run
    if count == 0:
        return None
    for ra, rl, rdev in regions:
        if rdev != dev or not (ra <= addr and addr + length <= ra + rl):
            continue
        if count == 1:
            return None
        last = addr + (count - 1) * stride
        if last + length <= ra + rl and last >= ra:
            return None
        if stride <= 0:
            return count - 1
        # the first block that ends past the region
        return (ra + rl - length - addr) // stride + 1
    return 0


class Fabric:
    """Every stand-in agent of one case, and the record of what they did."""

    def __init__(self):
        self.agents = {}  # SGLang's agent name (a uuid) -> FakeAgent
        self.alias = {}  # SGLang's agent name -> the driver's ("prefill-0", ...)
        self.pending_alias = None
        self.lock = threading.RLock()
        self.handles = itertools.count(1)
        self.registrations = []
        self.dlists = []
        self.xfers = []
        self.refusals = []

    def name_of(self, agent_name):
        return self.alias.get(agent_name, agent_name)

    def regions(self):
        """Per driver agent name, every registered region."""
        out = {}
        for reg in self.registrations:
            out.setdefault(reg["agent"], []).append(reg)
        return out


FABRIC = [None]


def current():
    return FABRIC[0]


def new_fabric():
    FABRIC[0] = Fabric()
    return FABRIC[0]


class XferDescs:
    """What `get_xfer_descs` and `register_memory` return: rows and a kind."""

    def __init__(self, rows, mem_type):
        self.rows = rows
        self.mem_type = str(mem_type)

    def __len__(self):
        return len(self.rows)

    def __bool__(self):
        return True


class nixl_agent:
    """The surface of `nixl._api.nixl_agent` that SGLang's manager calls."""

    def __init__(self, name, config=None, *args, **kwargs):
        fabric = current()
        if fabric is None:
            raise RuntimeError("the NIXL stand-in has no fabric (the driver did not start a case)")
        self.fabric = fabric
        self.name = name
        self.config = config
        self.backends = []
        self.regions = []  # (addr, len, dev, kind)
        self.remotes = {}  # agent name -> regions advertised in its metadata
        self.lists = {}  # handle -> (Runs, mem_type, target)
        self.xfer_table = {}
        self.notifs = {}  # peer agent name -> notification messages not yet read (get_new_notifs)
        with fabric.lock:
            fabric.agents[name] = self
            if fabric.pending_alias is not None:
                fabric.alias[name] = fabric.pending_alias
                fabric.pending_alias = None

    @property
    def label(self):
        return self.fabric.name_of(self.name)

    # -- backends, memory and metadata --
    def create_backend(self, backend, params=None, *args, **kwargs):
        self.backends.append(str(backend))
        return backend

    def get_plugin_list(self):
        return ["UCX", "GDS", "GDS_MT", "POSIX", "OBJ", "UCCL"]

    def register_memory(self, descs, mem_type=None, *args, **kwargs):
        if isinstance(descs, XferDescs):
            mem_type = mem_type or descs.mem_type
            descs = descs.rows
        kind = str(mem_type or "DRAM")
        rows = []
        for d in descs:
            addr, length, dev = int(d[0]), int(d[1]), int(d[2])
            rows.append((addr, length, dev))
            self.regions.append((addr, length, dev, kind))
            self.fabric.registrations.append(
                {"agent": self.label, "addr": addr, "len": length, "dev": dev, "mem": kind}
            )
        return XferDescs(rows, kind)

    def deregister_memory(self, *args, **kwargs):
        return None

    def get_agent_metadata(self):
        """What real metadata carries for a peer's checks: the name and the
        registered regions (a snapshot, as NIXL's metadata is)."""
        return json.dumps({"name": self.name, "regions": self.regions}).encode()

    def add_remote_agent(self, metadata):
        meta = json.loads(bytes(metadata).decode())
        self.remotes[meta["name"]] = [tuple(r) for r in meta["regions"]]
        return meta["name"].encode()

    def remove_remote_agent(self, name):
        self.remotes.pop(name, None)

    def check_remote_metadata(self, name, *args, **kwargs):
        return name in self.remotes

    # -- descriptor lists --
    def get_xfer_descs(self, descs, mem_type=None, *args, **kwargs):
        arr = np.asarray(descs, dtype=np.uint64) if len(descs) else np.empty((0, 3), dtype=np.uint64)
        return XferDescs(arr.reshape(-1, arr.shape[-1] if arr.ndim == 2 else 3), mem_type or "DRAM")

    def _regions_for(self, target, kind):
        if target == "":
            regions = self.regions
        else:
            if target not in self.remotes:
                raise nixlNotFoundError(f"NIXL_ERR_NOT_FOUND: no metadata for remote agent {target}")
            regions = self.remotes[target]
        return [(a, l, d) for a, l, d, k in regions if k == kind]

    def _contain(self, runs, target, kind, what, caller):
        """Refuse (NIXL_ERR_NOT_FOUND) the first descriptor outside every
        region of `target` ("" = this agent)."""
        regions = self._regions_for(target, kind)
        for r, run in enumerate(runs.runs()):
            k = uncovered(run, regions)
            if k is not None:
                addr, length, dev, stride, _ = run
                bad = addr + k * stride
                who = "this agent's" if target == "" else f"remote agent {self.fabric.name_of(target)}'s"
                reason = (
                    f"NIXL_ERR_NOT_FOUND: {what}: row {r} block {k} "
                    f"[{bad:#x}, {bad + length:#x}) dev {dev} lies in none of {who} registered {kind} regions"
                )
                self.fabric.refusals.append(
                    {
                        "agent": self.label,
                        "target": "local" if target == "" else self.fabric.name_of(target),
                        "what": what,
                        "row": r,
                        "block": k,
                        "addr": bad,
                        "len": length,
                        "dev": dev,
                        "mem": kind,
                        "reason": reason,
                        "caller": caller,
                    }
                )
                return reason
        return None

    def prep_xfer_dlist(self, agent_name, descs, mem_type=None, *args, **kwargs):
        caller = who_called()
        if isinstance(descs, XferDescs):
            mem_type = mem_type or descs.mem_type
            rows = descs.rows
        else:
            rows = descs
        kind = str(mem_type or "DRAM")
        target = "" if agent_name in ("", "NIXL_INIT_AGENT") else agent_name
        runs = Runs(rows)
        reason = self._contain(runs, target, kind, "prep_xfer_dlist", caller)
        with self.fabric.lock:
            handle = next(self.fabric.handles)
            self.fabric.dlists.append(
                {
                    "agent": self.label,
                    "handle": handle,
                    "target": "local" if target == "" else self.fabric.name_of(target),
                    "mem": kind,
                    "strided": runs.strided,
                    "rows": runs.as_json(),
                    "count": runs.count,
                    "refused": reason,
                    "made_by": caller,
                }
            )
        if reason is not None:
            raise nixlNotFoundError(reason)
        self.lists[handle] = (runs, kind, target)
        return handle

    def release_dlist_handle(self, handle):
        return None

    # -- transfers --
    def _record_xfer(self, record):
        with self.fabric.lock:
            handle = next(self.fabric.handles)
            record["handle"] = handle
            self.fabric.xfers.append(record)
            self.xfer_table[handle] = record
        return handle

    def make_prepped_xfer(self, op, local, local_ids, remote, remote_ids, notif_msg=b"", *args, **kwargs):
        caller = who_called()
        local_ids = [int(i) for i in np.asarray(local_ids).ravel()]
        remote_ids = [int(i) for i in np.asarray(remote_ids).ravel()]
        lruns, _, _ = self.lists[local]
        rruns, _, rtarget = self.lists[remote]
        problem = None
        if len(local_ids) != len(remote_ids):
            problem = f"{len(local_ids)} local desc ids against {len(remote_ids)} remote ones"
        else:
            for n, (li, ri) in enumerate(zip(local_ids, remote_ids)):
                if not (0 <= li < lruns.count and 0 <= ri < rruns.count):
                    problem = (
                        f"pair {n}: desc id {li} of a {lruns.count}-desc local list or "
                        f"{ri} of a {rruns.count}-desc remote list out of range"
                    )
                    break
                if lruns.desc(li)[1] != rruns.desc(ri)[1]:
                    problem = f"pair {n}: lengths differ ({lruns.desc(li)[1]} vs {rruns.desc(ri)[1]})"
                    break
        record = {
            "agent": self.label,
            "kind": "prepped",
            "op": str(op).upper(),
            "local": local,
            "remote": remote,
            "peer": self.fabric.name_of(rtarget),
            "local_ids": local_ids,
            "remote_ids": remote_ids,
            "posted": False,
            "refused": None if problem is None else f"NIXL_ERR_INVALID_PARAM: {problem}",
            "made_by": caller,
            "posted_by": None,
            "notif": bytes(notif_msg or b"").decode("latin-1"),
        }
        handle = self._record_xfer(record)
        if problem is not None:
            raise nixlInvalidParamError(record["refused"])
        return handle

    def initialize_xfer(self, op, local_descs, remote_descs, remote_agent, notif_msg=b"", *args, **kwargs):
        caller = who_called()
        lruns = Runs(local_descs.rows)
        rruns = Runs(remote_descs.rows)
        reason = self._contain(lruns, "", local_descs.mem_type, "initialize_xfer (local)", caller) or self._contain(
            rruns, remote_agent, remote_descs.mem_type, "initialize_xfer (remote)", caller
        )
        if reason is None and lruns.count != rruns.count:
            reason = f"NIXL_ERR_INVALID_PARAM: {lruns.count} local descriptors against {rruns.count} remote ones"
        if reason is None:
            for i in range(lruns.count):
                if lruns.desc(i)[1] != rruns.desc(i)[1]:
                    reason = f"NIXL_ERR_INVALID_PARAM: descriptor {i}: lengths differ"
                    break
        # Its own two lists, so the record reads like a prepared transfer.
        with self.fabric.lock:
            handles = []
            for runs, kind, target in (
                (lruns, local_descs.mem_type, "local"),
                (rruns, remote_descs.mem_type, self.fabric.name_of(remote_agent)),
            ):
                h = next(self.fabric.handles)
                handles.append(h)
                self.fabric.dlists.append(
                    {
                        "agent": self.label,
                        "handle": h,
                        "target": target,
                        "mem": str(kind),
                        "strided": False,
                        "rows": runs.as_json(),
                        "count": runs.count,
                        "refused": reason,
                        "made_by": caller,
                        "by_initialize_xfer": True,
                    }
                )
                self.lists[h] = (runs, str(kind), "" if target == "local" else remote_agent)
        record = {
            "agent": self.label,
            "kind": "initialize_xfer",
            "op": str(op).upper(),
            "local": handles[0],
            "remote": handles[1],
            "peer": self.fabric.name_of(remote_agent),
            "local_ids": list(range(lruns.count)),
            "remote_ids": list(range(rruns.count)),
            "posted": False,
            "refused": reason,
            "made_by": caller,
            "posted_by": None,
            "notif": bytes(notif_msg or b"").decode("latin-1"),
        }
        handle = self._record_xfer(record)
        if reason is not None:
            raise (nixlNotFoundError if "NOT_FOUND" in reason else nixlInvalidParamError)(reason)
        return handle

    def transfer(self, handle, *args, **kwargs):
        record = self.xfer_table[handle]
        record["posted_by"] = who_called()
        lruns, _, _ = self.lists[record["local"]]
        rruns, _, _ = self.lists[record["remote"]]
        for li, ri in zip(record["local_ids"], record["remote_ids"]):
            la, ll, _ = lruns.desc(li)
            ra, rl, _ = rruns.desc(ri)
            if record["op"] == "READ":
                ctypes.memmove(la, ra, min(ll, rl))
            else:
                ctypes.memmove(ra, la, min(ll, rl))
        record["posted"] = True
        if record.get("notif"):
            # NIXL delivers a transfer's notification to the target agent once
            # the transfer is done; SGLang <= 0.5.16's decode learns of
            # arrivals only this way (get_new_notifs).
            self._deliver(record["remote"], record["notif"].encode("latin-1"))
        return "DONE"

    def _deliver(self, remote_handle, msg):
        target = self.lists[remote_handle][2]
        self.send_notif(target, msg)

    def check_xfer_state(self, handle):
        return "DONE"

    def release_xfer_handle(self, handle):
        return None

    def get_xfer_telemetry(self, handle):
        return None

    def send_notif(self, agent_name, notif_msg):
        peer = self.fabric.agents.get(agent_name)
        if peer is not None:
            with self.fabric.lock:
                peer.notifs.setdefault(self.name, []).append(bytes(notif_msg))
        return None

    def get_new_notifs(self):
        with self.fabric.lock:
            out, self.notifs = self.notifs, {}
        return out


def install():
    """Put the stand-in in sys.modules as `nixl`, `nixl._api` and
    `nixl._bindings` (before SGLang's connection module is imported, so its
    module-level import of NIXL's error classes finds these). Returns the
    replaced modules, for uninstall()."""
    saved = {name: sys.modules.get(name) for name in ("nixl", "nixl._api", "nixl._bindings")}
    package = types.ModuleType("nixl")
    package.__path__ = []
    package.KVGEOM_STAND_IN = True
    api = types.ModuleType("nixl._api")
    api.nixl_agent = nixl_agent
    api.nixl_agent_config = nixl_agent_config
    api.nixl_thread_sync_t = nixl_thread_sync_t
    bindings = types.ModuleType("nixl._bindings")
    for cls in (nixlError, nixlNotFoundError, nixlInvalidParamError, nixlBackendError, nixlCancelledError,
                nixlRemoteDisconnectError):
        setattr(bindings, cls.__name__, cls)
    package._api = api
    package._bindings = bindings
    sys.modules["nixl"] = package
    sys.modules["nixl._api"] = api
    sys.modules["nixl._bindings"] = bindings
    return saved


def uninstall(saved):
    for name, module in saved.items():
        if module is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = module
