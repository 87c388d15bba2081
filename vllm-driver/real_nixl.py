"""Real NIXL agents for vLLM's connector workers, over host memory.

`RealNixlWrapper` takes the place of `nixl._api.nixl_agent` in vLLM's base
worker (one per worker, as vLLM creates them). Every call goes to a real
`nixl_agent` (UCX backend): registration, prepared lists, transfer
requests, posting, completion checks, notifications and metadata. Around
it the wrapper records each prepared list and transfer exactly as vLLM
made it, in the same `fake_nixl.Fabric` the stand-in fills, so that
result.json is the same whichever moved the bytes.

Memory types: the driver's tensors are host memory, but with the faked
CUDA platform vLLM 0.33.0 prepares some lists as VRAM (the per-source
split lists and the remote lists; README, "What is real and what is
faked"). Real NIXL finds no VRAM registration for them, so the wrapper
hands NIXL every list and registration as DRAM, the memory the bytes are
in, and records the type vLLM asked for. Nothing else is changed:
addresses, lengths, device ids, strided rows, desc ids and notification
texts reach NIXL as vLLM wrote them.

Handles: vLLM gets integers from the wrapper (the recorded handles), each
mapped to the real NIXL handle it stands for.
"""

import importlib
import importlib.metadata
import os
import threading
import time

import fake_nixl

# What `--nixl real` needs in the driver's interpreter.
INSTALL_HINT = (
    "install the nixl wheels into the driver's interpreter: "
    "scripts/install-vllm.sh --nixl (pip install --no-deps nixl==1.5.1 nixl-cu13==1.5.1)"
)

# NIXL's memory type for the bytes the driver's tensors hold.
HOST = "DRAM"


class NixlUnavailable(Exception):
    pass


def load():
    """The real `nixl._api` module and the installed NIXL version; raises
    NixlUnavailable with the import error and what to install."""
    # vLLM caps UCX's unreleased registrations before it first imports NIXL;
    # this import comes first, so the same setting is made here.
    os.environ.setdefault("UCX_RCACHE_MAX_UNRELEASED", "1024")
    try:
        api = importlib.import_module("nixl._api")
        getattr(api, "nixl_agent")
    except Exception as e:  # ImportError, or a native library that fails to load
        raise NixlUnavailable(f"the nixl package does not load ({type(e).__name__}: {e})") from e
    version = "?"
    for dist in ("nixl", "nixl-cu13", "nixl-cu12"):
        try:
            version = importlib.metadata.version(dist)
            break
        except importlib.metadata.PackageNotFoundError:
            continue
    return api, version


def probe():
    """Create two agents and move a few bytes with READ and WRITE, with a
    notification each way; raises NixlUnavailable with what went wrong."""
    api, version = load()
    try:
        import numpy as np

        a = api.nixl_agent("kvgeom-probe-a", api.nixl_agent_config(backends=["UCX"]))
        b = api.nixl_agent("kvgeom-probe-b", api.nixl_agent_config(backends=["UCX"]))
        src = np.arange(64, dtype=np.uint8)
        dst = np.zeros(64, dtype=np.uint8)
        ra = a.get_reg_descs([(src.ctypes.data, 64, 0, "")], HOST)
        rb = b.get_reg_descs([(dst.ctypes.data, 64, 0, "")], HOST)
        a.register_memory(ra)
        b.register_memory(rb)
        b.add_remote_agent(a.get_agent_metadata())
        local = b.prep_xfer_dlist("", [(dst.ctypes.data, 32, 0), (dst.ctypes.data + 32, 32, 0)], HOST)
        remote = b.prep_xfer_dlist("kvgeom-probe-a", [(src.ctypes.data, 32, 0), (src.ctypes.data + 32, 32, 0)], HOST)
        want = bytes(src[32:]) + bytes(src[:32])
        for op, ids in (("READ", [1, 0]), ("WRITE", [1])):
            h = b.make_prepped_xfer(op, local, ids, remote, ids[::-1], b"probe")
            state = b.transfer(h)
            for _ in range(1000000):
                if state != "PROC":
                    break
                state = b.check_xfer_state(h)
            if state != "DONE":
                raise RuntimeError(f"a probe {op} ended {state}")
            b.release_xfer_handle(h)
            if op == "READ" and bytes(dst) != want:
                raise RuntimeError("the probe's READ did not land where the desc ids say")
        if bytes(src[32:]) != want[32:]:
            raise RuntimeError("the probe's WRITE did not land where the desc ids say")
        notified = 0
        for _ in range(2000):
            notified += sum(len(v) for k, v in a.get_new_notifs().items() if k == "kvgeom-probe-b")
            if notified >= 2:
                break
            time.sleep(0.001)
        else:
            raise RuntimeError(f"{notified} of the probe's 2 notifications arrived")
        b.release_dlist_handle(local)
        b.release_dlist_handle(remote)
        b.remove_remote_agent("kvgeom-probe-a")
        a.deregister_memory(ra)
        b.deregister_memory(rb)
    except NixlUnavailable:
        raise
    except Exception as e:
        raise NixlUnavailable(
            f"nixl {version} loads but two agents cannot move host memory over UCX "
            f"({type(e).__name__}: {e}); where UCX fails to start, set UCX_TLS=tcp,sm,self UCX_NET_DEVICES=lo"
        ) from e
    return version


def _host(mem_type):
    """The memory type handed to NIXL: the bytes are host memory whatever
    vLLM labelled them."""
    return HOST if mem_type is not None else None


class RealNixlWrapper:
    """A real NIXL agent with vLLM's calls recorded as vLLM made them."""

    api = None  # nixl._api, set by the driver (`select`)

    def __init__(self, name, config=None, *args, **kwargs):
        fabric = fake_nixl.current()
        self.fabric = fabric
        self.name = name
        self.agent = self.api.nixl_agent(name, config, *args, **kwargs)
        fabric.agents[name] = self
        if fabric.pending_alias is not None:
            fabric.alias[name] = fabric.pending_alias
            fabric.pending_alias = None
        self.lock = threading.Lock()
        self.dlists = {}  # recorded handle -> (real handle, target)
        self.xfer_table = {}  # recorded handle -> (real handle, record)
        self.registered = []
        self.remotes = set()
        fabric.real.append(self)

    # -- backends, memory and metadata --
    def create_backend(self, backend, params=None):
        return self.agent.create_backend(backend, params or {})

    def get_reg_descs(self, descs, mem_type=None, *args, **kwargs):
        self.fabric.record_registration(self.name, list(descs))
        return self.agent.get_reg_descs(descs, _host(mem_type), *args, **kwargs)

    def register_memory(self, descs, *args, **kwargs):
        out = self.agent.register_memory(descs, *args, **kwargs)
        self.registered.append(descs)
        self.fabric.record_registration(self.name, backends=kwargs.get("backends"))
        return out

    def deregister_memory(self, descs, *args, **kwargs):
        self.registered = [d for d in self.registered if d is not descs]
        return self.agent.deregister_memory(descs, *args, **kwargs)

    def get_agent_metadata(self):
        return self.agent.get_agent_metadata()

    def add_remote_agent(self, metadata):
        name = self.agent.add_remote_agent(metadata)
        name = name.decode() if isinstance(name, bytes) else name
        self.remotes.add(name)
        return name

    def remove_remote_agent(self, name):
        self.remotes.discard(name)
        return self.agent.remove_remote_agent(name)

    def check_remote_metadata(self, name, *args, **kwargs):
        return self.agent.check_remote_metadata(name, *args, **kwargs)

    # -- descriptor lists --
    def prep_xfer_dlist(self, agent_name, descs, mem_type=None, *args, **kwargs):
        rows = fake_nixl.expand(descs)
        real = self.agent.prep_xfer_dlist(agent_name, descs, _host(mem_type), *args, **kwargs)
        handle, target = self.fabric.record_dlist(self.name, agent_name, mem_type, rows, descs)
        with self.lock:
            self.dlists[handle] = (real, target)
        return handle

    def release_dlist_handle(self, handle):
        with self.lock:
            real, _ = self.dlists.pop(handle, (None, None))
        if real is not None:
            self.agent.release_dlist_handle(real)

    # -- transfers --
    def make_prepped_xfer(self, op, local, local_ids, remote, remote_ids, notif_msg=b"", *args, **kwargs):
        with self.lock:
            real_local, _ = self.dlists[local]
            real_remote, target = self.dlists[remote]
        # The transfer is recorded before NIXL judges it, as the stand-in does.
        record = self.fabric.record_xfer(self.name, op, local, local_ids, remote, remote_ids, notif_msg)
        real = self.agent.make_prepped_xfer(
            op, real_local, local_ids, real_remote, remote_ids, notif_msg, *args, **kwargs
        )
        handle = next(self.fabric.handles)
        with self.lock:
            self.xfer_table[handle] = (real, record, target)
        self.fabric.record_xfer_handle(self.name, handle, record)
        return handle

    def transfer(self, handle, notif_msg=b""):
        with self.lock:
            real, record, target = self.xfer_table[handle]
        record["posted"] = True
        msg = bytes(notif_msg or b"") or record["notif"]
        if msg:
            # Counted as in flight until the target takes it.
            self.fabric.sent(target)
        state = self.agent.transfer(real, notif_msg) if notif_msg else self.agent.transfer(real)
        if state == "ERR" and msg:
            self.fabric.sent(target, -1)
        return state

    def check_xfer_state(self, handle):
        with self.lock:
            real, _, _ = self.xfer_table[handle]
        return self.agent.check_xfer_state(real)

    def release_xfer_handle(self, handle):
        with self.lock:
            real, _, _ = self.xfer_table.pop(handle, (None, None, None))
        if real is not None:
            self.agent.release_xfer_handle(real)

    def get_xfer_telemetry(self, handle):
        with self.lock:
            real, _, _ = self.xfer_table[handle]
        return self.agent.get_xfer_telemetry(real)

    # -- notifications --
    def send_notif(self, agent_name, notif_msg):
        self.fabric.sent(agent_name)
        try:
            return self.agent.send_notif(agent_name, notif_msg)
        except Exception:
            self.fabric.sent(agent_name, -1)
            raise

    def get_new_notifs(self):
        got = self.agent.get_new_notifs()
        fabric = self.fabric
        with fabric.lock:
            for sender, msgs in got.items():
                for msg in msgs:
                    fabric.notifs.append((sender, self.name, bytes(msg)))
                    fabric.in_flight[self.name] = fabric.in_flight.get(self.name, 0) - 1
        return got

    def pending_notifs(self):
        """Notifications sent to this agent that it has not taken yet (the
        driver's idle check; not a NIXL call)."""
        with self.fabric.lock:
            return max(0, self.fabric.in_flight.get(self.name, 0))

    # -- the end of a case --
    def close(self):
        """Release what vLLM left (handles, remote agents, registrations),
        so that the agent goes before the case's tensors do."""
        with self.lock:
            xfers = [real for real, _, _ in self.xfer_table.values()]
            lists = [real for real, _ in self.dlists.values()]
            self.xfer_table.clear()
            self.dlists.clear()
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
        self.agent = None


def _quiet(fn, *args):
    try:
        fn(*args)
    except Exception:
        pass


# The probe's answer on stdout: this, then the installed NIXL version.
VERSION_PREFIX = "real NIXL version "

# Exit status of `real_nixl.py --probe` (and of the driver) when real NIXL
# was asked for and cannot run.
UNAVAILABLE_STATUS = 4

if __name__ == "__main__":
    import sys

    sys.dont_write_bytecode = True
    if sys.argv[1:] != ["--probe"]:
        print("usage: real_nixl.py --probe", file=sys.stderr)
        sys.exit(2)
    try:
        version = probe()
    except NixlUnavailable as e:
        print(f"real NIXL: {e}; {INSTALL_HINT}", file=sys.stderr)
        sys.exit(UNAVAILABLE_STATUS)
    # NIXL logs to stdout too: the answer is the line that starts so.
    print(f"{VERSION_PREFIX}{version}")
