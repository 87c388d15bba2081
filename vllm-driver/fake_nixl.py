"""A NIXL stand-in for vLLM's connector workers: it keeps every prepared
descriptor list and transfer, and moves the bytes each transfer names
between the real host tensors, by address."""

import ctypes
import itertools
import threading


class Fabric:
    """Every stand-in agent of one case: names, memory, notifications, log."""

    def __init__(self):
        self.agents = {}  # vLLM's agent name -> FakeNixlWrapper
        self.alias = {}  # vLLM's agent name -> kvgeom's agent name
        self.pending_alias = None
        self.dlists = []
        self.xfers = []
        self.handles = itertools.count(1)
        # Push runs vLLM's writer threads: notifications cross threads.
        self.lock = threading.Lock()
        self.notifs = []  # every notification delivered: sender, receiver, text
        # Real NIXL (real_nixl.py): its agents, and per receiving agent the
        # notifications sent to it and not yet taken.
        self.real = []
        self.in_flight = {}
        # The v1 trace recorder (trace_v1.Recorder) when the batch records
        # traces of a pull case.
        self.v1 = None

    def record_dlist(self, agent, agent_name, mem_type, rows, descs=None):
        """Log a prepared list as vLLM asked for it (`descs`: vLLM's own
        strided rows, for the v1 trace); its new handle."""
        handle = next(self.handles)
        target = "local" if agent_name in ("", "NIXL_INIT_AGENT") else agent_name
        self.dlists.append({"agent": agent, "handle": handle, "target": target, "mem": str(mem_type), "rows": rows})
        if self.v1 is not None and descs is not None:
            self.v1.dlist(agent, handle, target, mem_type, descs, rows)
        return handle, target

    def record_registration(self, agent, descs=None, backends=None):
        """For the v1 trace: the rows of vLLM's `get_reg_descs` (`descs`),
        then their registration (`descs` None)."""
        if self.v1 is None:
            return
        if descs is not None:
            self.v1.reg_descs(agent, descs)
        else:
            self.v1.registered(agent, backends)

    def record_xfer_handle(self, agent, handle, record):
        """For the v1 trace: the handle vLLM got for a recorded transfer."""
        if self.v1 is not None:
            self.v1.xfer(agent, handle, record)

    def record_xfer(self, agent, op, local, local_ids, remote, remote_ids, notif_msg):
        """Log a prepared transfer (before anything judges it); the record."""
        record = {
            "agent": agent,
            "op": str(op).upper(),
            "local": local,
            "local_ids": [int(i) for i in local_ids],
            "remote": remote,
            "remote_ids": [int(i) for i in remote_ids],
            "posted": False,
            "notif": bytes(notif_msg or b""),
        }
        self.xfers.append(record)
        return record

    def sent(self, receiver, n=1):
        with self.lock:
            self.in_flight[receiver] = self.in_flight.get(receiver, 0) + n

    def close(self):
        """Release the real agents' NIXL state (nothing for the stand-in)."""
        for agent in self.real:
            agent.close()
        self.real = []

    def name_of(self, vllm_name):
        return self.alias.get(vllm_name, vllm_name)


FABRIC = [None]


def current():
    return FABRIC[0]


class FakeNixlWrapper:
    """The surface of `nixl._api.nixl_agent` that vLLM's worker calls."""

    def __init__(self, name, config=None, *args, **kwargs):
        fabric = current()
        self.fabric = fabric
        self.name = name
        fabric.agents[name] = self
        if fabric.pending_alias is not None:
            fabric.alias[name] = fabric.pending_alias
            fabric.pending_alias = None
        self.notifs = []
        self.regions = []
        self.lists = {}
        self.xfer_table = {}

    # -- memory and metadata --
    def create_backend(self, *args, **kwargs):
        return None

    def get_reg_descs(self, descs, mem_type=None, *args, **kwargs):
        self.fabric.record_registration(self.name, list(descs))
        return (list(descs), mem_type)

    def register_memory(self, descs, *args, **kwargs):
        rows = descs[0] if isinstance(descs, tuple) else descs
        self.regions.extend(rows)
        self.fabric.record_registration(self.name, backends=kwargs.get("backends"))

    def deregister_memory(self, *args, **kwargs):
        return None

    def get_agent_metadata(self):
        return self.name.encode()

    def add_remote_agent(self, metadata):
        return bytes(metadata).decode()

    def remove_remote_agent(self, name):
        return None

    def check_remote_metadata(self, *args, **kwargs):
        return True

    # -- descriptor lists --
    def get_xfer_descs(self, descs, mem_type=None, *args, **kwargs):
        """Plain rows `(addr, len, dev)` as a list for prep_xfer_dlist
        (vLLM before strided lists, e.g. 0.31.0 and 0.32.0)."""
        return (list(descs), mem_type)

    def prep_xfer_dlist(self, agent_name, descs, mem_type=None, *args, **kwargs):
        if mem_type is None and isinstance(descs, tuple) and len(descs) == 2:
            mem_type = descs[1]  # get_xfer_descs's
        rows = expand(descs)
        handle, _ = self.fabric.record_dlist(self.name, agent_name, mem_type, rows, descs)
        self.lists[handle] = rows
        return handle

    def release_dlist_handle(self, handle):
        return None

    # -- transfers --
    def make_prepped_xfer(
        self, op, local, local_ids, remote, remote_ids, notif_msg=b"", *args, **kwargs
    ):
        handle = next(self.fabric.handles)
        record = self.fabric.record_xfer(self.name, op, local, local_ids, remote, remote_ids, notif_msg)
        self.xfer_table[handle] = record
        self.fabric.record_xfer_handle(self.name, handle, record)
        return handle

    def transfer(self, handle, *args, **kwargs):
        record = self.xfer_table[handle]
        record["posted"] = True
        local = self.lists[record["local"]]
        remote = self.lists[record["remote"]]
        for li, ri in zip(record["local_ids"], record["remote_ids"]):
            la, ll, _ = local[li]
            ra, rl, _ = remote[ri]
            n = min(ll, rl)
            if record["op"] == "READ":
                ctypes.memmove(la, ra, n)
            else:
                ctypes.memmove(ra, la, n)
        if record["notif"]:
            remote_name = next(
                d["target"] for d in self.fabric.dlists if d["handle"] == record["remote"]
            )
            self.deliver(remote_name, record["notif"])
        return "DONE"

    def check_xfer_state(self, handle):
        return "DONE"

    def release_xfer_handle(self, handle):
        return None

    def get_xfer_telemetry(self, handle):
        """A finished transfer's telemetry, as NIXL gives it with telemetry
        on (vLLM's agent config asks for it): times in microseconds (zero:
        the stand-in's copies are done when posted), the bytes moved and
        the descriptor pairs. Some releases (0.31.0 and before) read it
        without a None check, and a None there fails the transfer."""
        record = self.xfer_table.get(handle)
        pairs, moved = 0, 0
        if record is not None and record.get("posted"):
            local = self.lists[record["local"]]
            remote = self.lists[record["remote"]]
            for li, ri in zip(record["local_ids"], record["remote_ids"]):
                pairs += 1
                moved += min(local[li][1], remote[ri][1])
        return Telemetry(startTime=0, postDuration=0, xferDuration=0, totalBytes=moved, descCount=pairs)

    # -- notifications --
    def deliver(self, agent_name, msg):
        peer = self.fabric.agents.get(agent_name)
        if peer is not None:
            with self.fabric.lock:
                peer.notifs.append((self.name, bytes(msg)))
                self.fabric.notifs.append((self.name, agent_name, bytes(msg)))

    def send_notif(self, agent_name, notif_msg):
        self.deliver(agent_name, notif_msg)

    def get_new_notifs(self):
        with self.fabric.lock:
            taken, self.notifs = self.notifs, []
        out = {}
        for sender, msg in taken:
            out.setdefault(sender, []).append(msg)
        return out

    def pending_notifs(self):
        with self.fabric.lock:
            return len(self.notifs)


class Telemetry:
    """The fields of NIXL's `nixlXferTelemetry` that vLLM reads."""

    def __init__(self, **fields):
        self.__dict__.update(fields)


def expand(descs):
    """Rows `(addr, len, dev)` of a list given as strided runs
    `(addr, len, dev, stride, count)` or as plain rows."""
    if isinstance(descs, tuple) and len(descs) == 2:
        descs = descs[0]
    rows = []
    for d in list(descs):
        d = [int(x) for x in d]
        if len(d) >= 5:
            addr, length, dev, stride, count = d[:5]
            for k in range(count):
                rows.append((addr + k * stride, length, dev))
        else:
            rows.append((d[0], d[1], d[2]))
    return rows
