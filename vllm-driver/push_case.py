"""One kvgeom case on vLLM's real NIXL connector workers in push mode.

Real: NixlPushConnectorWorker on every rank of both engines, with its
registration, `start_load_kv` (decode's registration with prefill, prefill's
finished blocks), its writer threads (decode's notification-only handshake
and PUSH_REG; prefill's full handshake with decode and the WRITEs of
`_xfer_blocks_for_req`), and `get_transfer_results` on both engines
(decode's completion count and its receive post-process on the tensors).

Faked on top of live_case's fakes: the handshake's ZMQ socket. A request to
an engine's side channel is answered in process with the asked rank's own
handshake payload, as vLLM's listener would answer it.

From live_case it shares the cache building and worker construction
(`make_worker`, given the push worker class), `finish` (final memory, lists
and transfers) and `Unsupported`: a geometry live_case cannot build is
refused here with the same message.

One order between vLLM's threads is fixed: in a step that hands a rank
both a push registration and heartbeats (decode's first step on the
scheduler path), the rank's push writer thread takes the registration
(`_send_registration_to_p`, which starts the notification-only handshake)
before `start_load_kv` sends the heartbeats (whose handshake with a
one-stage prefill is the full one). Both ask `_ensure_handshake` for the
same engine and the first decides which handshake both get; left to the
threads, a full handshake that raises (decode's blocks smaller than
prefill's) fails the request on decode in some runs and not in others.

The case ends when decode has reported the request received, when a worker
raised, or when nothing can progress any more (every handshake and writer
queue drained, no notification in flight) while decode still waits: that is
reported `hung` with what was pending, without waiting out the time-out.
"""

import contextlib
import os
import sys
import threading
import time
import traceback

import msgspec

from vllm.distributed.kv_transfer.kv_connector.v1.nixl import base_worker
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.metadata import (
    GET_META_MSG,
    PUSH_REG_NOTIF_PREFIX,
    NixlConnectorMetadata,
    RemoteMeta,
    ReqMeta,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl.push_worker import (
    NixlPushConnectorWorker,
)

import compat_hash
import failure
import fake_nixl
import live_case
from live_case import Unsupported, agent

# The request's id on both engines (vLLM matches them by their base id).
REQUEST = "req-0"
# Side channels of the two engines, as the proxy would advertise them.
CHANNELS = {"prefill": ("127.0.0.1", 5601), "decode": ("127.0.0.1", 5602)}
# The driver sets this from the batch: a case's whole budget.
CASE_LIMIT_S = 10.0
# Nothing may move, with no worker thread running (`_running`), for this
# long before a waiting case counts as stuck. A thread still running (a
# push writer copying a large request on a busy machine) keeps the clock at
# zero: such a case is stuck only at the deadline.
SETTLE_S = 0.25
# ... or for this long, when every worker thread then parks (`_settled`)
# within PROBE_S of the last engine step.
PARKED_SETTLE_S = 0.03
PROBE_S = 0.1
POLL_S = 0.001
# How long a step's heartbeats wait for the push writer thread to take the
# step's registrations (`_registrations_first`); past it they go anyway.
REGISTRATION_WAIT_S = 2.0


class _SideChannels:
    """The engines' handshake listeners: ZMQ path -> {(pp, tp): payload}."""

    def __init__(self, addresses=None):
        self.served = {}
        # Each engine's (host, port): CHANNELS, or what vLLM's schedulers
        # advertised for a case whose requests come from them.
        self.addresses = addresses or CHANNELS

    def serve(self, side, rank, worker):
        host, port = self.addresses[side]
        path = f"tcp://{host}:{port}"
        payload = msgspec.msgpack.encode(worker.xfer_handshake_metadata)
        self.served.setdefault(path, {})[(0, rank)] = payload


_CHANNELS = [None]


class _Socket:
    """The REQ socket of `_nixl_handshake`, answered in process."""

    def __init__(self, path):
        self.path = path
        self.reply = None

    def setsockopt(self, *args, **kwargs):
        return None

    def send(self, msg):
        kind, pp_rank, tp_rank = msgspec.msgpack.decode(msg)
        table = _CHANNELS[0].served.get(self.path, {})
        if kind != GET_META_MSG or (pp_rank, tp_rank) not in table:
            # vLLM's socket would time out (RCVTIMEO) on a silent peer.
            raise TimeoutError(f"no handshake listener for rank {tp_rank} at {self.path}")
        self.reply = [table[(pp_rank, tp_rank)], msgspec.msgpack.encode(time.perf_counter())]

    def recv_multipart(self):
        reply, self.reply = self.reply, None
        return reply


@contextlib.contextmanager
def _zmq_ctx(socket_type, path):
    yield _Socket(path)


base_worker.zmq_ctx = _zmq_ctx


class _Log:
    """What the workers did that vLLM only logs: failures, handshakes, raises."""

    def __init__(self, fabric):
        self.fabric = fabric
        self.failures = []  # vLLM's _log_failure calls
        self.raised = []  # exceptions the writer threads swallow
        self.handshakes = []

    def watch(self, w, name):
        log_failure = w._log_failure

        def logged(failure_type, req_id=None, msg="", error=None, **kwargs):
            self.failures.append(
                {
                    "agent": name,
                    "failure_type": failure_type,
                    "error": _text(error) if error is not None else msg,
                }
            )
            return log_failure(failure_type=failure_type, req_id=req_id, msg=msg, error=error, **kwargs)

        w._log_failure = logged
        for method in ("add_remote_agent", "_add_notif_only_remote_agent"):
            w.__dict__[method] = self._handshake(getattr(w, method), name)
        for method in ("_do_start_push_kv", "_send_registration_to_p"):
            w.__dict__[method] = self._raising(getattr(w, method), name, method)

    def _handshake(self, fn, name):
        full = fn.__name__ == "add_remote_agent"

        def traced(meta, *args, **kwargs):
            rank = (args[0] if args else kwargs.get("remote_tp_rank", 0)) if full else "?"
            entry = {"agent": name, "remote": f"{meta.engine_id}-{rank}", "ok": False, "notif_only": not full}
            self.handshakes.append(entry)
            try:
                out = fn(meta, *args, **kwargs)
            except Exception as e:
                entry["message"] = _text(e)
                raise
            entry["ok"] = True
            if not full:
                # The notification-only handshake names no rank; its agent does.
                entry["remote"] = self.fabric.name_of(out)
            return out

        traced.__name__ = fn.__name__
        return traced

    def _raising(self, fn, name, method):
        def traced(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except Exception as e:
                self.raised.append({"agent": name, "in": method, "message": _text(e), "trace": traceback.format_exc()})
                raise

        return traced


def _registrations_first(w):
    """Make `w` send a step's heartbeats only once its push writer thread has
    taken each of the step's registrations (returned from
    `_send_registration_to_p`, raised or not), or after REGISTRATION_WAIT_S
    (a writer that never runs). A step without both is not held."""
    send_heartbeats = getattr(w, "_send_heartbeats", None)
    if send_heartbeats is None:
        return  # a release without heartbeats: nothing to order
    taken = set()
    changed = threading.Condition()
    send_registration = w._send_registration_to_p

    def registration(req_id, *args, **kwargs):
        try:
            return send_registration(req_id, *args, **kwargs)
        finally:
            with changed:
                taken.add(req_id)
                changed.notify_all()

    def heartbeats(metadata, *args, **kwargs):
        wanted = set(metadata.push_registrations or ())
        if wanted and metadata.heartbeat_by_engine:
            with changed:
                changed.wait_for(lambda: wanted <= taken, timeout=REGISTRATION_WAIT_S)
        return send_heartbeats(metadata, *args, **kwargs)

    w.__dict__["_send_registration_to_p"] = registration
    w.__dict__["_send_heartbeats"] = heartbeats


def _text(e):
    """An exception as `Type: text`; a bare assertion names its line instead."""
    text = str(e)
    if not text and e.__traceback__ is not None:
        frame = traceback.extract_tb(e.__traceback__)[-1]
        text = f"{frame.line} ({frame.filename.split('site-packages/')[-1]}:{frame.lineno})"
    factors = compat_hash.explain(e)
    if factors:
        # vLLM's own hash mismatch names hashes only: the factors that differ.
        text = f"{text} [differing factors: {factors}]"
    return f"{type(e).__name__}: {text}"


def _idle(workers):
    """Nothing in flight: no handshake, no queued writer work, no notification."""
    for w in workers:
        if w._handshake_futures:
            return False
        for q in (w._reg_send_inbox, w._deferred_push_inbox, w._finished_blocks_inbox, w._pending_completion_notifs):
            if not q.empty():
                return False
        if w.nixl_wrapper.pending_notifs():
            return False
    return True


def _where(frames, thread):
    """`((file, function), frame)` of a thread's innermost Python frame in
    `frames` (`sys._current_frames()`); `(None, None)` when it has none."""
    frame = frames.get(thread.ident)
    if frame is None:
        return None, None
    return (os.path.basename(frame.f_code.co_filename), frame.f_code.co_name), frame


def _parked(workers):
    """Every thread of the workers is blocked with nothing to do: none is
    running (`_running`), each push writer waits and has no wake-up pending
    (the untimed wait; a writer polling for a registration waits with a
    time-out), each handshake executor waits for work. With nothing queued
    either (`_idle`), only the case's own thread can make anything happen."""
    frames = sys._current_frames()
    if _running(workers, frames):
        return False
    for w in workers:
        writer = w._push_writer_thread
        if writer is not None and writer.is_alive():
            if _where(frames, writer)[0] is None:
                return False
            if not w._push_finished_blocks and w._push_writer_wake.is_set():
                return False
        executor = w._handshake_initiation_executor
        if executor._work_queue.qsize():
            return False
        for t in list(executor._threads):
            at, _ = _where(frames, t)
            if at is not None and at != ("thread.py", "_worker"):
                return False
    return True


def _running(workers, frames=None):
    """Some worker thread is executing, not waiting: a push writer outside
    its wait (copying a request, which on a busy machine can take longer
    than SETTLE_S), or a handshake executor inside a work item."""
    frames = sys._current_frames() if frames is None else frames
    for w in workers:
        writer = w._push_writer_thread
        if writer is not None and writer.is_alive():
            at, _ = _where(frames, writer)
            if at is not None and at != ("threading.py", "wait"):
                return True
        executor = w._handshake_initiation_executor
        for t in list(executor._threads):
            _, frame = _where(frames, t)
            if frame is not None and "work_item" in frame.f_locals:
                return True
    return False


def _settled(workers, fabric, log, state):
    """Without waking anyone, wait up to PROBE_S for every worker thread to
    park (`_parked`) with nothing queued and nothing new since `state`, and
    to be found so again PARKED_SETTLE_S later: one look can fall in a
    moment no frame shows (a thread just handed work, a first call's lazy
    set-up), two that far apart do not."""
    until = time.monotonic() + PROBE_S
    first = None
    while time.monotonic() < until:
        if _parked(workers) and _idle(workers) and _progress(fabric, log) == state:
            now = time.monotonic()
            if first is None:
                first = now
            elif now - first >= PARKED_SETTLE_S:
                return True
        else:
            first = None
        time.sleep(POLL_S)
    return False


def _progress(fabric, log):
    return (len(fabric.xfers), len(fabric.notifs), len(log.failures), len(log.raised), len(log.handshakes))


class _Scheduled:
    """A push case's requests as vLLM's schedulers built them (`placed`:
    place_case.load_metas): each engine's steps of pickled connector
    metadata, the request's id on each engine, and the side channels the
    metadata names."""

    def __init__(self, placed):
        import place_case

        _, pkl = placed
        self.unpickle = place_case.unpickle
        self.prefill_steps = pkl["prefill"]
        self.decode_steps = pkl["decode"]
        self.request = pkl["request_ids"]["decode"]
        self.connectors = {}
        registration = None
        for step in self.decode_steps:
            registration = (self.unpickle(step).push_registrations or {}).get(self.request, registration)
        if registration is None:
            raise Unsupported("vLLM's decode scheduler handed its workers no push registration")
        self.addresses = {
            "prefill": (registration["remote_host"], registration["remote_port"]),
            "decode": (registration["decode_host"], registration["decode_port"]),
        }


def run(spec, case_dir, placed=None):
    fabric = fake_nixl.Fabric()
    fake_nixl.FABRIC[0] = fabric
    log = _Log(fabric)
    geometry = spec["geometry"]
    ranks = {}
    try:
        sched = _Scheduled(placed) if placed is not None else None
    except Unsupported as e:
        fabric.close()
        return {"status": "error", "message": f"push mode: {e}"}
    channels = _SideChannels(sched.addresses if sched is not None else None)
    _CHANNELS[0] = channels
    try:
        try:
            for side in ("prefill", "decode"):
                for r in range(geometry[side]["tp_size"]):
                    if sched is None:
                        w, raw = live_case.make_worker(spec, side, r, fabric, case_dir, NixlPushConnectorWorker)
                    else:
                        from vllm.distributed.kv_transfer.kv_connector.v1.nixl.connector import NixlPushConnector

                        conn, w, raw = live_case.make_connector(spec, side, r, fabric, case_dir, NixlPushConnector)
                        sched.connectors[(side, r)] = conn
                    ranks[(side, r)] = (w, raw)
                    channels.serve(side, r, w)
                    log.watch(w, agent(side, r))
                    _registrations_first(w)
        except Unsupported as e:
            return {"status": "error", "message": f"push mode: {e}"}
        except live_case.RegistrationRaised as e:
            return e.result()
        result = {
            "regions": {agent(side, r): list(raw) for (side, r), (_, raw) in ranks.items()},
            "handshakes": log.handshakes,
            "post_process": [],
        }
        _drive(spec, ranks, fabric, log, result, sched)
        result["failures"] = log.failures
        if log.raised:
            result["raised"] = log.raised
        return _finish(result, ranks, fabric, case_dir)
    finally:
        for w, _ in ranks.values():
            with contextlib.suppress(Exception):
                w.shutdown()
        fabric.close()


def _drive(spec, ranks, fabric, log, result, sched=None):
    geometry = spec["geometry"]
    p_tp = geometry["prefill"]["tp_size"]
    d_tp = geometry["decode"]["tp_size"]
    prefill = [ranks[("prefill", r)][0] for r in range(p_tp)]
    decode = [ranks[("decode", r)][0] for r in range(d_tp)]
    if sched is None:
        request = REQUEST
        _start_direct(spec, prefill, decode, result, p_tp, d_tp)
        results_of = {id(w): w.get_transfer_results for w in prefill + decode}
        bound = []
    else:
        request = sched.request
        bound = _start_scheduled(spec, sched, prefill, decode, result, p_tp, d_tp)
        results_of = {
            id(w): (lambda c=sched.connectors[(side, r)]: c.get_transfer_results(set()))
            for side, ws in (("prefill", prefill), ("decode", decode))
            for r, w in enumerate(ws)
        }
    if spec.get("block_in_case"):
        # Test hook: the case's thread stays blocked with the workers and
        # their writer threads alive, as if vLLM's code never returned.
        threading.Event().wait()

    # Engine steps: each engine asks its workers for finished transfers
    # (which also wakes their writer threads) until decode has the request.
    received = {}
    failed = {}
    started = time.monotonic()
    deadline = started + 0.8 * CASE_LIMIT_S
    quiet_since = None
    last = None
    while True:
        for d, w in enumerate(decode):
            if d in received or d in failed:
                continue
            try:
                results = results_of[id(w)]()
            except Exception as e:
                result.update(failure.outcome(e, "decode", _text(e)))
                return
            if request in results.failed_recving:
                failed[d] = sorted(results.finished_recving)
            elif request in results.finished_recving:
                received[d] = sorted(results.finished_recving)
                result["post_process"].append({"agent": agent("decode", d), "done_recving": received[d]})
        for p, w in enumerate(prefill):
            try:
                results_of[id(w)]()
            except Exception as e:
                result.update(failure.outcome(e, "prefill", _text(e)))
                return
        # The model runner clears the step's metadata once it has asked for
        # the step's finished transfers.
        while bound:
            bound.pop().clear_connector_metadata()
        if log.raised:
            # vLLM's writer thread logs this and goes on; decode would wait.
            # The other ranks' writers may raise too, in whatever order their
            # threads run: let them, then name the lowest rank, so that one
            # case reads the same on every run.
            _let_writers_finish(prefill, decode, log)
            first = min(log.raised, key=lambda r: _agent_order(r["agent"]))
            side = "prefill" if first["agent"].startswith("prefill") else "decode"
            result.update(
                status="crashed",
                side=side,
                message=f"{first['agent']} {first['in']}: {first['message']}"
                " (vLLM's push writer thread logs it and goes on; decode would wait for the push)",
                trace=first["trace"],
            )
            return
        if len(received) + len(failed) == d_tp:
            break
        now = time.monotonic()
        state = _progress(fabric, log)
        if state != last or not _idle(prefill + decode) or _running(prefill + decode):
            last, quiet_since = state, now
        quiet = now - quiet_since
        settled = quiet >= PARKED_SETTLE_S and _settled(prefill + decode, fabric, log, state)
        if settled or quiet >= SETTLE_S or now > deadline:
            result.update(status="hung", message=_pending(spec, prefill, decode, received, log, request))
            return
        time.sleep(POLL_S)
    if failed:
        d = min(failed)
        why = [f for f in log.failures if f["agent"] == agent("decode", d)]
        message = why[0]["error"] if why else "decode reported the request failed"
        result.update(status="rejected", side="decode", message=f"decode-{d}: {message}")
        return
    result["status"] = "done"


def _start_scheduled(spec, sched, prefill, decode, result, p_tp, d_tp):
    """Each rank gets, step by step, its own unpickled copy of its engine's
    connector metadata through its connector, as vLLM's model runner hands
    it: prefill's steps (the request scheduled, then finished: its blocks),
    then decode's (the request to receive and its push registration).
    Every step but each engine's last is also asked for finished transfers
    and cleared; the last stays bound until the first engine step of the
    loop has asked. Returns the connectors still bound."""
    from live_case import transfer_results

    bound = []
    for side, workers, steps in (("prefill", prefill, sched.prefill_steps), ("decode", decode, sched.decode_steps)):
        for r, w in enumerate(workers):
            conn = sched.connectors[(side, r)]
            if side == "decode":
                live_case.watch_post_process(
                    w, agent("decode", r), result, result["regions"][agent("decode", r)], spec.get("skip_receive_post_process")
                )
            for i, step in enumerate(steps):
                conn.bind_connector_metadata(sched.unpickle(step))
                conn.start_load_kv(None)
                if i + 1 < len(steps):
                    transfer_results(conn)
                    conn.clear_connector_metadata()
                else:
                    bound.append(conn)
    return bound


def _start_direct(spec, prefill, decode, result, p_tp, d_tp):
    """The driver's own metadata for the workers (`requests` direct)."""
    transfer_blocks = [list(g) for g in spec["decode"]["transfer_blocks"]]

    # Prefill's scheduler: the request finished, its blocks wait for decode.
    for w in prefill:
        meta = NixlConnectorMetadata()
        meta.push_finished_blocks[REQUEST] = tuple(list(g) for g in spec["prefill"]["request_blocks"])
        meta.reqs_in_batch.add(REQUEST)
        meta.reqs_to_send[REQUEST] = time.perf_counter() + 3600.0
        meta.scheduler_clock = time.perf_counter()
        w.start_load_kv(meta)
    # Decode's scheduler: the request waits for prefill's push; its
    # registration names decode's blocks (the remote list stays empty, as
    # vLLM's push scheduler leaves it).
    host, port = CHANNELS["decode"]
    p_host, p_port = CHANNELS["prefill"]
    for d, w in enumerate(decode):
        meta = NixlConnectorMetadata()
        meta.reqs_to_recv[REQUEST] = ReqMeta(
            local_block_ids=tuple(transfer_blocks),
            local_physical_block_ids=tuple(transfer_blocks),
            tp_size=p_tp,
            local_num_computed_blocks=tuple(spec["decode"]["computed_blocks"]),
            remote=RemoteMeta(
                block_ids=(),
                host=p_host,
                port=p_port,
                engine_id="prefill",
                request_id=REQUEST,
                num_tokens=spec["transferred_tokens"],
            ),
            awaiting_kvs=True,
        )
        meta.push_registrations[REQUEST] = {
            "request_id": REQUEST,
            "decode_engine_id": "decode",
            "decode_host": host,
            "decode_port": port,
            "decode_tp_size": d_tp,
            "local_block_ids": tuple(transfer_blocks),
            "remote_engine_id": "prefill",
            "remote_host": p_host,
            "remote_port": p_port,
            "remote_tp_size": p_tp,
            "remote_pp_size": 1,
        }
        live_case.watch_post_process(
            w, agent("decode", d), result, result["regions"][agent("decode", d)], spec.get("skip_receive_post_process")
        )
        w.start_load_kv(meta)


def _agent_order(name):
    """`prefill-10` after `prefill-2`: side, then rank as a number."""
    side, _, rank = name.rpartition("-")
    return (side, int(rank) if rank.isdigit() else -1, name)


def _let_writers_finish(prefill, decode, log):
    """Wake the prefill writers until each prefill rank has raised, or for
    SETTLE_S while no worker thread executes and nothing is queued."""
    ranks = {agent("prefill", p) for p in range(len(prefill))}
    quiet_since = time.monotonic()
    give_up = quiet_since + 8 * SETTLE_S
    while not ranks <= {r["agent"] for r in log.raised} and time.monotonic() < give_up:
        for w in prefill:
            try:
                w.get_transfer_results()
            except Exception:
                pass  # the failure that matters is already in the log
        now = time.monotonic()
        if not _idle(prefill + decode) or _running(prefill + decode):
            quiet_since = now
        if now - quiet_since >= SETTLE_S:
            return
        time.sleep(POLL_S)


def _pending(spec, prefill, decode, received, log, request=REQUEST):
    """Why the case cannot finish: who waits, and what vLLM logged."""
    waiting = [agent("decode", d) for d in range(len(decode)) if d not in received]
    verb = "waits" if len(waiting) == 1 else "wait"
    parts = [f"{', '.join(waiting)} still {verb} for the push of {request}"]
    for d, w in enumerate(decode):
        if d in received:
            continue
        got = w.consumer_notification_counts_by_req.get(request, 0)
        parts.append(f"{agent('decode', d)} has {got} completion notification(s)")
    for p, w in enumerate(prefill):
        if w._push_finished_blocks:
            parts.append(f"{agent('prefill', p)} holds finished blocks no registration matched")
        if w._pending_d_registrations:
            parts.append(f"{agent('prefill', p)} holds registrations of {sorted(w._pending_d_registrations)}")
    # The worker threads log in whatever order they run; the message names
    # the failures by agent so that one case reads the same on every run.
    for f in sorted(log.failures, key=lambda f: (_agent_order(f["agent"]), f["failure_type"], f["error"])):
        parts.append(f"{f['agent']} logged {f['failure_type']}: {f['error']}")
    return "; ".join(parts)


def _finish(result, ranks, fabric, case_dir):
    out = live_case.finish(result, ranks, fabric, case_dir)
    name = fabric.name_of
    out["notifs"] = [{"from": name(s), "to": name(r), "text": _notif_text(m)} for s, r, m in fabric.notifs]
    return out


def _notif_text(msg):
    if msg.startswith(PUSH_REG_NOTIF_PREFIX):
        reg = msgspec.msgpack.decode(msg[len(PUSH_REG_NOTIF_PREFIX) :])
        return f"{PUSH_REG_NOTIF_PREFIX.decode()}{reg.get('request_id')} blocks {reg.get('local_block_ids')}"
    return msg.decode("utf-8", "replace")
