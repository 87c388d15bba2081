"""Real NIXL agents for SGLang's NIXL KV manager, over host memory.

`RecordingAgent` is what SGLang's `NixlKVManager` gets as `nixl_agent`
(`install()` serves it as `nixl._api.nixl_agent`; NIXL's own config class,
thread-sync enum and error classes are served unchanged). Each of its
methods calls the same method of a real `nixl_agent` (UCX backend): memory
registration, metadata, descriptor lists, transfers, their state and
notifications are NIXL's. Around each call it records what SGLang asked
for, in the `fake_nixl.Fabric` of the case and in the stand-in's format
(registrations, prepared lists with the SGLang function and thread that
made them, transfers with who made and posted them, refusals), so that
result.json, every oracle and the layout check read the same whichever
moved the bytes.

Memory kinds: SGLang registers the KV pools and state as VRAM (device id
= the rank's GPU id), the aux rows as DRAM; here every byte is host
memory, so NIXL is handed DRAM for all of them and the record keeps the
kind SGLang asked for. Addresses, lengths, device ids, strided rows, desc
ids and notification texts reach NIXL as SGLang wrote them.

Refusals are NIXL's: a list or transfer NIXL refuses raises NIXL's own
error into SGLang. The record names the first descriptor outside the
target's registered regions by the stand-in's rule (`fake_nixl.uncovered`,
held to NIXL's by nixl_probe.py), with NIXL's error text.

    python real_nixl.py --probe

imports NIXL, starts two agents and moves bytes both ways; prints `real
NIXL version X` (exit 0) or `real NIXL: why; what to install` (exit 4).
"""

import gc
import importlib
import importlib.metadata
import os
import sys
import threading
import time
import types

import numpy as np

import fake_nixl

# What `--nixl real` needs in the driver's interpreter.
INSTALL_HINT = (
    "install the nixl wheels into the driver's interpreter: "
    "scripts/install-sglang.sh --nixl (pip install --no-deps nixl==1.5.1 nixl-cu13==1.5.1)"
)
# The probe's answer on stdout: this, then the installed NIXL version.
VERSION_PREFIX = "real NIXL version "
# Exit status of the probe (and of the driver) when real NIXL cannot run.
UNAVAILABLE_STATUS = 4
# The memory kind handed to NIXL: the driver's pools are host tensors.
HOST = "DRAM"
# UCX over loopback, for agents in one process on host memory.
UCX_DEFAULTS = {"UCX_TLS": "tcp,sm,self", "UCX_NET_DEVICES": "lo"}


class NixlUnavailable(Exception):
    pass


LOADED = {}  # "api", "bindings", "version" once loaded


def load():
    """NIXL's `_api` and `_bindings` modules and its version; raises
    NixlUnavailable with the import error."""
    if LOADED:
        return LOADED
    for key, value in UCX_DEFAULTS.items():
        os.environ.setdefault(key, value)
    os.environ.setdefault("UCX_RCACHE_MAX_UNRELEASED", "1024")
    saved = {name: sys.modules.pop(name) for name in ("nixl", "nixl._api", "nixl._bindings") if name in sys.modules}
    try:
        api = importlib.import_module("nixl._api")
        bindings = importlib.import_module("nixl._bindings")
        getattr(api, "nixl_agent")
    except Exception as e:  # ImportError, or a native library that fails to load
        sys.modules.update(saved)
        raise NixlUnavailable(f"the nixl package does not load ({type(e).__name__}: {e})") from e
    version = "?"
    for dist in ("nixl", "nixl-cu13", "nixl-cu12"):
        try:
            version = importlib.metadata.version(dist)
            break
        except importlib.metadata.PackageNotFoundError:
            continue
    LOADED.update(api=api, bindings=bindings, version=version, package=sys.modules["nixl"])
    # What was served as `nixl` before (the stand-in, in a process that
    # runs both) is served again; install() serves NIXL's.
    for name in ("nixl", "nixl._api", "nixl._bindings"):
        sys.modules.pop(name, None)
    sys.modules.update(saved)
    return LOADED


def probe():
    """Two agents move bytes with a READ and a WRITE over host memory, and
    a notification arrives; the NIXL version, or NixlUnavailable."""
    nixl = load()
    api = nixl["api"]
    try:
        a = api.nixl_agent("kvgeom-sglang-probe-a", api.nixl_agent_config(backends=["UCX"]))
        b = api.nixl_agent("kvgeom-sglang-probe-b", api.nixl_agent_config(backends=["UCX"]))
        src = np.arange(64, dtype=np.uint8)
        dst = np.zeros(64, dtype=np.uint8)
        a.register_memory([(src.ctypes.data, 64, 0, "")], HOST)
        b.register_memory([(dst.ctypes.data, 64, 0, "")], HOST)
        b.add_remote_agent(a.get_agent_metadata())
        local = b.prep_xfer_dlist("", [(dst.ctypes.data, 32, 0), (dst.ctypes.data + 32, 32, 0)], HOST)
        remote = b.prep_xfer_dlist("kvgeom-sglang-probe-a", [(src.ctypes.data, 32, 0), (src.ctypes.data + 32, 32, 0)],
                                   HOST)
        for op, ids in (("READ", [1, 0]), ("WRITE", [1])):
            h = b.make_prepped_xfer(op, local, ids, remote, ids[::-1], b"probe")
            state = b.transfer(h)
            deadline = time.time() + 30
            while state == "PROC" and time.time() < deadline:
                state = b.check_xfer_state(h)
            if state != "DONE":
                raise RuntimeError(f"a probe {op} ended {state}")
            b.release_xfer_handle(h)
        # READ: dst = src's halves swapped; WRITE: dst's second half (src's
        # first) onto src's second half.
        first, second = bytes(range(32)), bytes(range(32, 64))
        if bytes(dst) != second + first or bytes(src) != first + first:
            raise RuntimeError("the probe's bytes did not land where the desc ids say")
        got = 0
        deadline = time.time() + 30
        while got < 2 and time.time() < deadline:
            got += sum(len(v) for v in a.get_new_notifs().values())
            time.sleep(0.001)
        if got < 2:
            raise RuntimeError(f"{got} of the probe's 2 notifications arrived")
    except Exception as e:
        raise NixlUnavailable(
            f"nixl {nixl['version']} loads but two agents cannot move host memory over UCX "
            f"({type(e).__name__}: {e}; UCX_TLS={os.environ.get('UCX_TLS')}, "
            f"UCX_NET_DEVICES={os.environ.get('UCX_NET_DEVICES')})"
        ) from e
    return nixl["version"]


class Descs:
    """What `get_xfer_descs` returns to SGLang: NIXL's list, with the rows
    and the memory kind SGLang gave (for the record)."""

    def __init__(self, real, rows, mem_type):
        self.real = real
        self.rows = rows
        self.mem_type = str(mem_type or HOST)

    def __len__(self):
        return len(self.rows)

    def __bool__(self):
        return True


AGENTS = []  # every RecordingAgent of the running case, for close_all()


class RecordingAgent:
    """A real `nixl_agent` with SGLang's calls recorded as SGLang made them."""

    def __init__(self, name, config=None, *args, **kwargs):
        fabric = fake_nixl.current()
        if fabric is None:
            raise RuntimeError("real NIXL's recorder has no fabric (the driver did not start a case)")
        self.fabric = fabric
        self.name = name
        self.agent = LOADED["api"].nixl_agent(name, config, *args, **kwargs)
        self.lock = threading.Lock()
        self.regions = []  # (addr, len, dev, kind as SGLang asked)
        self.lists = {}  # recorded handle -> (NIXL's handle, Runs, target)
        self.xfer_table = {}  # recorded handle -> (NIXL's handle, record)
        self.registered = []
        self.remotes = set()
        with fabric.lock:
            fabric.agents[name] = self
            if fabric.pending_alias is not None:
                fabric.alias[name] = fabric.pending_alias
                fabric.pending_alias = None
        AGENTS.append(self)

    @property
    def label(self):
        return self.fabric.name_of(self.name)

    # -- backends, memory and metadata --
    def create_backend(self, backend, params=None, *args, **kwargs):
        return self.agent.create_backend(backend, params or {}, *args, **kwargs)

    def get_plugin_list(self):
        return self.agent.get_plugin_list()

    def register_memory(self, descs, mem_type=None, *args, **kwargs):
        kind = str(mem_type or HOST)
        rows = [(int(d[0]), int(d[1]), int(d[2])) for d in descs]
        out = self.agent.register_memory([(a, n, d, "") for a, n, d in rows], HOST, *args, **kwargs)
        self.registered.append(out)
        with self.fabric.lock:
            for addr, length, dev in rows:
                self.regions.append((addr, length, dev, kind))
                self.fabric.registrations.append(
                    {"agent": self.label, "addr": addr, "len": length, "dev": dev, "mem": kind})
        return out

    def deregister_memory(self, descs, *args, **kwargs):
        self.registered = [d for d in self.registered if d is not descs]
        return self.agent.deregister_memory(descs, *args, **kwargs)

    def get_agent_metadata(self):
        return self.agent.get_agent_metadata()

    def add_remote_agent(self, metadata):
        name = self.agent.add_remote_agent(metadata)
        self.remotes.add(name.decode() if isinstance(name, bytes) else name)
        return name

    def remove_remote_agent(self, name):
        self.remotes.discard(name.decode() if isinstance(name, bytes) else name)
        return self.agent.remove_remote_agent(name)

    def check_remote_metadata(self, name, *args, **kwargs):
        return self.agent.check_remote_metadata(name, *args, **kwargs)

    # -- descriptor lists --
    def get_xfer_descs(self, descs, mem_type=None, *args, **kwargs):
        arr = np.asarray(descs, dtype=np.uint64) if len(descs) else np.empty((0, 3), dtype=np.uint64)
        arr = arr.reshape(-1, arr.shape[-1] if arr.ndim == 2 else 3)
        return Descs(self.agent.get_xfer_descs(descs, HOST, *args, **kwargs), arr, mem_type)

    def _regions_of(self, target, kind):
        """(addr, len, dev) of `target`'s regions ("" = this agent) of `kind`."""
        if target == "":
            regions = self.regions
        else:
            peer = self.fabric.agents.get(target)
            regions = peer.regions if peer is not None else []
        return [(a, n, d) for a, n, d, k in regions if k == kind]

    def _refused(self, runs, target, kind, what, caller, error):
        """Record NIXL's refusal of a list, naming its first descriptor that
        lies outside the target's regions; the reason recorded."""
        row, block, addr, length, dev = None, None, None, None, None
        regions = self._regions_of(target, kind)
        for r, run in enumerate(runs.runs()):
            k = fake_nixl.uncovered(run, regions)
            if k is not None:
                row, block = r, k
                addr, length, dev = run[0] + k * run[3], run[1], run[2]
                break
        where = "" if row is None else (
            f": row {row} block {block} [{addr:#x}, {addr + length:#x}) dev {dev} lies in none of "
            f"{'this agent' if target == '' else self.fabric.name_of(target)}'s registered {kind} regions")
        reason = f"{_nixl_code(error)}: {what} (real NIXL: {type(error).__name__}){where}"
        if _nixl_code(error) == "NIXL_ERR_NOT_FOUND":
            with self.fabric.lock:
                self.fabric.refusals.append({
                    "agent": self.label, "target": "local" if target == "" else self.fabric.name_of(target),
                    "what": what, "row": row, "block": block, "addr": addr, "len": length, "dev": dev,
                    "mem": kind, "reason": reason, "caller": caller})
        return reason

    def prep_xfer_dlist(self, agent_name, descs, mem_type=None, *args, **kwargs):
        caller = fake_nixl.who_called()
        if isinstance(descs, Descs):
            kind = str(mem_type or descs.mem_type)
            rows, real_descs = descs.rows, descs.real
        else:
            kind = str(mem_type or HOST)
            rows, real_descs = descs, descs
        target = "" if agent_name in ("", "NIXL_INIT_AGENT") else agent_name
        runs = fake_nixl.Runs(rows)
        try:
            real = self.agent.prep_xfer_dlist(agent_name, real_descs, HOST, *args, **kwargs)
            reason = None
        except Exception as e:
            real = None
            reason = self._refused(runs, target, kind, "prep_xfer_dlist", caller, e)
            error = e
        with self.fabric.lock:
            handle = next(self.fabric.handles)
            self.fabric.dlists.append({
                "agent": self.label, "handle": handle,
                "target": "local" if target == "" else self.fabric.name_of(target),
                "mem": kind, "strided": runs.strided, "rows": runs.as_json(), "count": runs.count,
                "refused": reason, "made_by": caller})
        if reason is not None:
            raise error
        with self.lock:
            self.lists[handle] = (real, runs, target)
        return handle

    def release_dlist_handle(self, handle):
        with self.lock:
            real, _, _ = self.lists.pop(handle, (None, None, None))
        if real is not None:
            return self.agent.release_dlist_handle(real)
        return None

    # -- transfers --
    def _record_xfer(self, record):
        with self.fabric.lock:
            handle = next(self.fabric.handles)
            record["handle"] = handle
            self.fabric.xfers.append(record)
        return handle

    def make_prepped_xfer(self, op, local, local_ids, remote, remote_ids, notif_msg=b"", *args, **kwargs):
        caller = fake_nixl.who_called()
        with self.lock:
            real_local, _, _ = self.lists[local]
            real_remote, _, target = self.lists[remote]
        record = {
            "agent": self.label, "kind": "prepped", "op": str(op).upper(), "local": local, "remote": remote,
            "peer": self.fabric.name_of(target),
            "local_ids": [int(i) for i in np.asarray(local_ids).ravel()],
            "remote_ids": [int(i) for i in np.asarray(remote_ids).ravel()],
            "posted": False, "refused": None, "made_by": caller, "posted_by": None,
            "notif": bytes(notif_msg or b"").decode("latin-1")}
        handle = self._record_xfer(record)
        try:
            real = self.agent.make_prepped_xfer(op, real_local, local_ids, real_remote, remote_ids, notif_msg,
                                                *args, **kwargs)
        except Exception as e:
            record["refused"] = f"{_nixl_code(e)}: make_prepped_xfer (real NIXL: {type(e).__name__}: {e})"
            raise
        with self.lock:
            self.xfer_table[handle] = (real, record)
        return handle

    def initialize_xfer(self, op, local_descs, remote_descs, remote_agent, notif_msg=b"", *args, **kwargs):
        caller = fake_nixl.who_called()
        lruns = fake_nixl.Runs(local_descs.rows)
        rruns = fake_nixl.Runs(remote_descs.rows)
        try:
            real = self.agent.initialize_xfer(op, local_descs.real, remote_descs.real, remote_agent, notif_msg,
                                              *args, **kwargs)
            reason = None
        except Exception as e:
            real = None
            error = e
            reason = None
            for runs, target, descs, what in ((lruns, "", local_descs, "initialize_xfer (local)"),
                                              (rruns, remote_agent, remote_descs, "initialize_xfer (remote)")):
                if any(fake_nixl.uncovered(run, self._regions_of(target, descs.mem_type)) is not None
                       for run in runs.runs()):
                    reason = self._refused(runs, target, descs.mem_type, what, caller, e)
                    break
            if reason is None:
                reason = f"{_nixl_code(e)}: initialize_xfer (real NIXL: {type(e).__name__}: {e})"
        with self.fabric.lock:
            handles = []
            for runs, kind, target in ((lruns, local_descs.mem_type, "local"),
                                       (rruns, remote_descs.mem_type, self.fabric.name_of(remote_agent))):
                h = next(self.fabric.handles)
                handles.append(h)
                self.fabric.dlists.append({
                    "agent": self.label, "handle": h, "target": target, "mem": str(kind), "strided": False,
                    "rows": runs.as_json(), "count": runs.count, "refused": reason, "made_by": caller,
                    "by_initialize_xfer": True})
        record = {
            "agent": self.label, "kind": "initialize_xfer", "op": str(op).upper(), "local": handles[0],
            "remote": handles[1], "peer": self.fabric.name_of(remote_agent),
            "local_ids": list(range(lruns.count)), "remote_ids": list(range(rruns.count)),
            "posted": False, "refused": reason, "made_by": caller, "posted_by": None,
            "notif": bytes(notif_msg or b"").decode("latin-1")}
        handle = self._record_xfer(record)
        if reason is not None:
            raise error
        with self.lock:
            self.xfer_table[handle] = (real, record)
        return handle

    def transfer(self, handle, *args, **kwargs):
        with self.lock:
            real, record = self.xfer_table[handle]
        record["posted_by"] = fake_nixl.who_called()
        state = self.agent.transfer(real, *args, **kwargs)
        record["posted"] = state != "ERR"
        return state

    def check_xfer_state(self, handle):
        with self.lock:
            real, _ = self.xfer_table[handle]
        return self.agent.check_xfer_state(real)

    def release_xfer_handle(self, handle):
        with self.lock:
            real, _ = self.xfer_table.pop(handle, (None, None))
        if real is not None:
            return self.agent.release_xfer_handle(real)
        return None

    def get_xfer_telemetry(self, handle):
        with self.lock:
            real, _ = self.xfer_table[handle]
        return self.agent.get_xfer_telemetry(real)

    # -- notifications --
    def send_notif(self, agent_name, notif_msg):
        return self.agent.send_notif(agent_name, notif_msg)

    def get_new_notifs(self):
        return self.agent.get_new_notifs()

    # -- the end of a case --
    def close(self):
        """Release what SGLang left (transfer and list handles, remote
        agents, registrations) and drop the agent, before the case's
        tensors go."""
        with self.lock:
            xfers = [real for real, _ in self.xfer_table.values()]
            lists = [real for real, _, _ in self.lists.values()]
            self.xfer_table.clear()
            self.lists.clear()
        for real in xfers:
            _quiet(self.agent.release_xfer_handle, real)
        for real in lists:
            _quiet(self.agent.release_dlist_handle, real)
        for name in list(self.remotes):
            _quiet(self.agent.remove_remote_agent, name)
        self.remotes.clear()
        for descs in self.registered:
            _quiet(self.agent.deregister_memory, descs)
        self.registered = []
        # NIXL ends the agent (its UCX workers and threads) when the last
        # reference goes; SGLang's manager keeps this wrapper.
        self.agent = _Closed(self.name)


class _Closed:
    """An agent after its case: any call says so."""

    def __init__(self, name):
        self.name = name

    def __getattr__(self, method):
        raise RuntimeError(f"NIXL agent {self.name} was closed at the end of its case ({method})")


def _quiet(fn, *args):
    try:
        fn(*args)
    except Exception:
        pass


def _nixl_code(error):
    """NIXL's status name for one of its errors (`nixlNotFoundError` ->
    NIXL_ERR_NOT_FOUND)."""
    name = type(error).__name__
    if name.startswith("nixl") and name.endswith("Error"):
        words = []
        for ch in name[4:-5]:
            if ch.isupper() and words:
                words.append("_")
            words.append(ch.upper())
        return "NIXL_ERR_" + "".join(words)
    return "NIXL_ERR_UNKNOWN"


def close_all():
    """Close every agent of the case (after the case's threads were told to end)."""
    while AGENTS:
        AGENTS.pop().close()
    gc.collect()


def surface():
    """What SGLang's connection module takes from NIXL, as served here (for
    api_check.missing)."""
    ns = types.SimpleNamespace(**{n: getattr(LOADED["bindings"], n) for n in dir(LOADED["bindings"])
                                  if n.startswith("nixl")})
    ns.nixl_agent = RecordingAgent
    ns.nixl_agent_config = LOADED["api"].nixl_agent_config
    ns.nixl_thread_sync_t = LOADED["api"].nixl_thread_sync_t
    return ns


def install():
    """Serve `nixl._api` with the recording agent and NIXL's own config,
    thread-sync enum and error classes (`nixl._bindings` is NIXL's). Returns
    the replaced modules."""
    nixl = load()
    saved = {name: sys.modules.get(name) for name in ("nixl", "nixl._api", "nixl._bindings")}
    api = types.ModuleType("nixl._api")
    for name in dir(nixl["api"]):
        if not name.startswith("__"):
            setattr(api, name, getattr(nixl["api"], name))
    api.nixl_agent = RecordingAgent
    package = types.ModuleType("nixl")
    package.__path__ = []
    package.KVGEOM_REAL_NIXL = nixl["version"]
    package._api = api
    package._bindings = nixl["bindings"]
    sys.modules["nixl"] = package
    sys.modules["nixl._api"] = api
    sys.modules["nixl._bindings"] = nixl["bindings"]
    return saved


def uninstall(saved):
    fake_nixl.uninstall(saved)


if __name__ == "__main__":
    sys.dont_write_bytecode = True
    if sys.argv[1:] != ["--probe"]:
        print("usage: real_nixl.py --probe", file=sys.stderr)
        sys.exit(2)
    try:
        found = probe()
    except NixlUnavailable as e:
        print(f"real NIXL: {e}; {INSTALL_HINT}", file=sys.stderr)
        sys.exit(UNAVAILABLE_STATUS)
    # NIXL logs to stdout too: the answer is the line that starts so.
    print(f"{VERSION_PREFIX}{found}")
