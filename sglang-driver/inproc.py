"""SGLang's control plane kept inside the driver's process, on loopback only.

SGLang's P/D managers talk over two channels besides NIXL:

- HTTP to the prefill's bootstrap server (`/route` PUT by each prefill rank,
  `/route` GET by decode, `/health` by decode's heartbeat), through the
  `requests` module of `sglang.srt.disaggregation.common.conn`;
- ZMQ: each manager binds one PULL socket (`get_zmq_socket_on_host`), and
  sends PUSH frames to its peers (`CommonKVManager._connect` for prefill's
  status messages, `CommonKVReceiver._connect` for decode's registration and
  per-request metadata).

`Hub.patch()` replaces exactly those four names. The frames SGLang builds
are delivered unchanged to the peer's socket, where SGLang's own threads
(prefill's bootstrap thread, decode's listener) receive and parse them; the
bootstrap table answers what SGLang's bootstrap server would from the rows
the prefill ranks registered. Nothing is bound and no packet is sent: every
address SGLang asks for is recorded (`Hub.addresses`), and one that is not
127.0.0.1 is refused. `guard_network()` additionally records and refuses
any real socket `bind`/`connect` outside loopback in the process (the test
of that promise).
"""

import queue
import socket
import threading
import urllib.parse

LOOPBACK = "127.0.0.1"


class LeftLoopback(ConnectionError):
    """SGLang asked for an address that is not 127.0.0.1."""


class StopThread(SystemExit):
    """Raised at case end in a SGLang thread blocked on an in-process socket.
    A SystemExit, so SGLang's `except Exception` handlers let it through and
    `threading` ends the thread without a report."""


def split_endpoint(endpoint):
    """`tcp://host:port` -> (host, port)."""
    rest = endpoint.split("://", 1)[-1]
    host, _, port = rest.rpartition(":")
    return host.strip("[]"), int(port)


class PullSocket:
    """A bound PULL socket: frames in, in order."""

    def __init__(self, hub, host, port):
        self.hub = hub
        self.host = host
        self.port = port
        self.inbox = queue.Queue()

    def recv_multipart(self, *args, **kwargs):
        item = self.inbox.get()
        if item is StopThread:
            raise StopThread()
        return item

    def close(self, *args, **kwargs):
        self.inbox.put(StopThread)

    def setsockopt(self, *args, **kwargs):
        return None


class PushSocket:
    def __init__(self, hub, host, port, owner):
        self.hub = hub
        self.host = host
        self.port = port
        self.owner = owner

    def send_multipart(self, parts, *args, **kwargs):
        self.hub.deliver(self.owner, self.host, self.port, [bytes(p) for p in parts])

    def close(self, *args, **kwargs):
        return None


class Response:
    def __init__(self, status_code, payload=None, text=""):
        self.status_code = status_code
        self._payload = payload
        self.text = text if payload is None else str(payload)

    def json(self):
        return self._payload


class Hub:
    """The in-process sockets and bootstrap table of one case."""

    def __init__(self):
        self.lock = threading.Lock()
        self.sockets = {}  # (host, port) -> PullSocket
        self.next_port = 47000
        self.addresses = []  # every address SGLang bound, connected or requested
        self.messages = []  # every frame list delivered: who, to, first frame
        self.routes = []  # every row a prefill rank registered (PUT /route)
        self.http = []  # every HTTP request: method, url, status
        self.undeliverable = []
        self.owner_of_port = {}  # port -> driver agent name

    # -- addresses --
    def note(self, kind, host, port=None, who=None):
        with self.lock:
            self.addresses.append({"kind": kind, "host": host, "port": port, "by": who})
        if host != LOOPBACK:
            raise LeftLoopback(f"SGLang asked to {kind} {host}:{port}; the driver keeps it on {LOOPBACK}")

    # -- ZMQ --
    def bind(self, host, who=None):
        host = host or LOOPBACK
        with self.lock:
            port = self.next_port
            self.next_port += 1
        self.note("bind", host, port, who)
        sock = PullSocket(self, host, port)
        with self.lock:
            self.sockets[(host, port)] = sock
        return port, sock

    def deliver(self, sender, host, port, parts):
        with self.lock:
            sock = self.sockets.get((host, port))
            self.messages.append(
                {"from": sender, "to": self.owner_of_port.get(port, f"{host}:{port}"),
                 "first_frame": parts[0][:24].decode("latin-1") if parts else "", "frames": len(parts)}
            )
        if sock is None:
            self.undeliverable.append({"from": sender, "to": f"{host}:{port}"})
            import zmq

            raise zmq.ZMQError(msg=f"no socket bound at {host}:{port} in this case")
        sock.inbox.put(parts)

    def stop_threads(self):
        """Wake every thread blocked on an in-process socket so that it ends."""
        with self.lock:
            socks = list(self.sockets.values())
        for sock in socks:
            sock.inbox.put(StopThread)

    # -- the bootstrap server's table --
    def _route_put(self, payload):
        with self.lock:
            self.routes.append(dict(payload))
        return Response(200, text="OK")

    def _route_get(self, query):
        q = {k: int(v[0]) for k, v in urllib.parse.parse_qs(query).items()}
        with self.lock:
            rows = list(self.routes)
        if not rows:
            return Response(503, text="Prefill server not fully registered yet (0 workers registered).")
        first = rows[0]
        dp_size = first["attn_dp_size"] if first["system_dp_size"] == 1 else first["system_dp_size"]
        expected = dp_size * first["attn_cp_size"] * first["attn_tp_size"] * first["pp_size"]
        if len(rows) < expected:
            return Response(503, text=f"Prefill server not fully registered yet ({len(rows)} workers registered).")
        keys = ("prefill_dp_rank", "prefill_cp_rank", "target_tp_rank", "target_pp_rank")
        if all(q.get(k) == -1 for k in keys):
            info = {
                "attn_tp_size": first["attn_tp_size"],
                "attn_cp_size": first["attn_cp_size"],
                "dp_size": dp_size,
                "pp_size": first["pp_size"],
                "page_size": first["page_size"],
                "kv_cache_dtype": first["kv_cache_dtype"],
                "follow_bootstrap_room": first.get("load_balance_method", "follow_bootstrap_room")
                == "follow_bootstrap_room",
                "enable_dsa_cache_layer_split": bool(first.get("enable_dsa_cache_layer_split", False)),
                "enable_kv_cache_sharding": bool(first.get("enable_kv_cache_sharding", False)),
                "prefill_http_port": first.get("prefill_http_port"),
                "decode_allocation_policy": first.get("decode_allocation_policy", "early"),
            }
            if first.get("kv_layout") is not None:
                info["kv_layout"] = first["kv_layout"]
            if first.get("dsv41_spec_layout") is not None:
                info["dsv41_spec_layout"] = first["dsv41_spec_layout"]
            if INFO_FIELDS:
                # SGLang's server answers its own PrefillServerInfo as a dict:
                # a release whose dataclass lacks a newer field never sends it.
                info = {k: v for k, v in info.items() if k in INFO_FIELDS}
            return Response(200, info)
        for row in rows:
            dp_group = row["attn_dp_rank"] if row["system_dp_size"] == 1 else row["system_dp_rank"]
            if (dp_group, row["attn_cp_rank"], row["attn_tp_rank"], row["pp_rank"]) == tuple(q[k] for k in keys):
                return Response(200, {"rank_ip": row["rank_ip"], "rank_port": int(row["rank_port"])})
        return Response(404, text="Bootstrap info not found")

    def http_request(self, method, url, json=None, **kwargs):
        parsed = urllib.parse.urlsplit(url)
        host = parsed.hostname or ""
        try:
            self.note(f"http {method}", host, parsed.port)
        except LeftLoopback as e:
            self.http.append({"method": method, "url": url, "status": None})
            raise ConnectionError(str(e)) from e
        path = parsed.path
        if path == "/route" and method == "PUT":
            r = self._route_put(json or {})
        elif path == "/route" and method == "GET":
            r = self._route_get(parsed.query)
        elif path == "/health":
            r = Response(200, text="OK")
        elif path == "/register_dp_rank":
            r = Response(200, text="OK")
        elif path == "/query_dp_ranks":
            r = Response(200, {})
        else:
            r = Response(404, text=f"no {method} {path} in the driver's bootstrap table")
        self.http.append({"method": method, "url": url, "status": r.status_code})
        return r

HUB = [None]


def current():
    return HUB[0]


def new_hub():
    HUB[0] = Hub()
    return HUB[0]


def receiver_agent():
    """The decode rank whose receiver is connecting (SGLang's receiver
    `_connect` is a classmethod): the `kv_mgr` of the nearest receiver on
    the stack."""
    import sys

    frame = sys._getframe(2)
    while frame is not None:
        mgr = getattr(frame.f_locals.get("self"), "kv_mgr", None)
        if mgr is not None:
            return getattr(mgr, "_kvgeom_agent", None)
        frame = frame.f_back
    return None


INFO_FIELDS = set()  # the installed PrefillServerInfo's fields (set by patch)


def patch(common_conn):
    """Replace SGLang's four transport names with the current hub's
    (module-level, once per process; each case installs its own hub).
    Returns what was replaced."""
    import dataclasses as _dataclasses
    import threading as _threading

    INFO_FIELDS.clear()
    INFO_FIELDS.update(f.name for f in _dataclasses.fields(common_conn.PrefillServerInfo))

    saved = {
        "get_zmq_socket_on_host": common_conn.get_zmq_socket_on_host,
        "requests": common_conn.requests,
        "CommonKVManager._connect": common_conn.CommonKVManager.__dict__["_connect"],
        "CommonKVReceiver._connect": common_conn.CommonKVReceiver.__dict__["_connect"],
    }

    def get_zmq_socket_on_host(context, socket_type, host=None, restrict_peers=False):
        return current().bind(host or LOOPBACK)

    def manager_connect(self, endpoint, is_ipv6=False):
        host, port = split_endpoint(endpoint)
        hub = current()
        hub.note("connect", host, port, getattr(self, "_kvgeom_agent", None))
        if hasattr(self, "_socket_send_locks"):  # 0.5.23 (0.5.16's _connect keeps no per-endpoint lock)
            self._socket_send_locks.setdefault(endpoint, _threading.Lock())
        return PushSocket(hub, host, port, getattr(self, "_kvgeom_agent", None))

    locks = {}

    def receiver_connect(cls, endpoint, is_ipv6=False):
        host, port = split_endpoint(endpoint)
        hub = current()
        who = receiver_agent()
        hub.note("connect", host, port, who)
        lock = locks.setdefault(endpoint, _threading.Lock())
        return PushSocket(hub, host, port, who), lock

    import requests as real_requests

    class Session:
        """requests.Session, answered by the current case's hub (sessions
        outlive a case in SGLang's thread-local cache)."""

        def __init__(self, *args, **kwargs):
            pass

        def mount(self, *args, **kwargs):
            return None

        def get(self, url, **kwargs):
            return current().http_request("GET", url, **kwargs)

        def post(self, url, **kwargs):
            return current().http_request("POST", url, **kwargs)

        def put(self, url, **kwargs):
            return current().http_request("PUT", url, **kwargs)

        def close(self):
            return None

    class Adapters:
        class HTTPAdapter:
            def __init__(self, *args, **kwargs):
                pass

    class RequestsProxy:
        """The `requests` module as SGLang's common connection module sees it."""

        exceptions = real_requests.exceptions
        RequestException = real_requests.RequestException
        adapters = Adapters

        def __init__(self):
            self.Session = Session

        def get(self, url, **kwargs):
            return current().http_request("GET", url, **kwargs)

        def put(self, url, **kwargs):
            return current().http_request("PUT", url, **kwargs)

        def post(self, url, **kwargs):
            return current().http_request("POST", url, **kwargs)

    common_conn.get_zmq_socket_on_host = get_zmq_socket_on_host
    common_conn.requests = RequestsProxy()
    common_conn.CommonKVManager._connect = manager_connect
    common_conn.CommonKVReceiver._connect = classmethod(receiver_connect)
    return saved


# -- the process-wide guard (tests) --
NET_LOG = []


def guard_network():
    """Record every real socket bind/connect of this process, and refuse
    those outside loopback (and AF_UNIX paths are allowed). Idempotent."""
    if getattr(socket.socket, "_kvgeom_guarded", False):
        return NET_LOG

    def caller():
        import sys

        frame = sys._getframe(2)
        while frame is not None and frame.f_globals.get("__name__") in (__name__, "socket"):
            frame = frame.f_back
        return f"{frame.f_globals.get('__name__')}:{frame.f_lineno}" if frame is not None else None

    def check(kind, address):
        host = address[0] if isinstance(address, tuple) else address
        NET_LOG.append({"kind": kind, "address": repr(address), "host": host, "by": caller()})
        if isinstance(address, tuple) and host not in (LOOPBACK, "localhost", "::1", ""):
            raise LeftLoopback(f"{kind} {address!r} leaves loopback")

    real_connect = socket.socket.connect
    real_connect_ex = socket.socket.connect_ex
    real_bind = socket.socket.bind

    def connect(self, address):
        check("connect", address)
        return real_connect(self, address)

    def connect_ex(self, address):
        check("connect", address)
        return real_connect_ex(self, address)

    def bind(self, address):
        check("bind", address)
        return real_bind(self, address)

    socket.socket.connect = connect
    socket.socket.connect_ex = connect_ex
    socket.socket.bind = bind
    socket.socket._kvgeom_guarded = True
    try:
        import zmq

        real_zbind = zmq.Socket.bind
        real_zconnect = zmq.Socket.connect

        def zcheck(kind, endpoint):
            NET_LOG.append({"kind": f"zmq {kind}", "address": endpoint, "host": None, "by": caller()})
            if endpoint.startswith("tcp://"):
                host, _ = split_endpoint(endpoint)
                if host not in (LOOPBACK, "localhost", "::1"):
                    raise LeftLoopback(f"zmq {kind} {endpoint} leaves loopback")

        def zbind(self, addr):
            zcheck("bind", addr)
            return real_zbind(self, addr)

        def zconnect(self, addr):
            zcheck("connect", addr)
            return real_zconnect(self, addr)

        zmq.Socket.bind = zbind
        zmq.Socket.connect = zconnect
    except ImportError:
        pass
    return NET_LOG
