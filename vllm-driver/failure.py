"""Whose failure an exception is: vLLM's own (`crashed`, a verdict on the
connector) or the driver's (`error`, a harness error that judges nothing).

An exception is the driver's when it was raised in a file of vllm-driver/
(the driver's code, its patches of vLLM's methods included), or when vLLM
raised it because the driver called it with something malformed: a
`TypeError` of the call itself (an unexpected or missing argument) raised
in the first vLLM frame below the driver's call. Everything else vLLM
raises is its own. The NIXL agents vLLM calls (the stand-in,
fake_nixl.py, and the real-NIXL wrapper, real_nixl.py) stand where NIXL
stands: what they raise at vLLM's call (a descriptor id outside the list
vLLM prepared, a transfer NIXL refuses) is NIXL's answer to vLLM, so a
verdict on vLLM, never a harness error.

`outcome(e, side)` gives the result fields of a case that ended with `e`;
the harness error's message names the driver's file and line, the vLLM
release and the vLLM frame involved.
"""

import os
import re
import traceback

DRIVER_DIR = os.path.dirname(os.path.abspath(__file__))
# The driver's NIXL agents: NIXL's side of vLLM's calls.
NIXL_FILES = {"fake_nixl.py", "real_nixl.py"}

# A TypeError of the call itself: what the caller passed does not fit.
_MALFORMED_CALL = re.compile(
    r"unexpected keyword argument|missing \d+ required (?:positional |keyword-only )?argument"
    r"|takes (?:from )?\d+ (?:to \d+ )?positional arguments? but|got multiple values for argument"
)


def _in_driver(frame):
    path = os.path.abspath(frame.filename)
    return os.path.dirname(path) == DRIVER_DIR and os.path.basename(path) not in NIXL_FILES


def _in_nixl(frame):
    path = os.path.abspath(frame.filename)
    return os.path.dirname(path) == DRIVER_DIR and os.path.basename(path) in NIXL_FILES


def _short(frame):
    name = frame.filename
    if _in_driver(frame):
        name = f"vllm-driver/{os.path.basename(name)}"
    elif "site-packages/" in name:
        name = name.split("site-packages/")[-1]
    return f"{name}:{frame.lineno} ({frame.name})"


def _release():
    try:
        import importlib.metadata

        return f"vLLM {importlib.metadata.version('vllm')}"
    except Exception:
        return "vLLM (version unknown)"


def driver_fault(e):
    """The harness error text when `e` is the driver's failure, else None."""
    cause = getattr(e, "cause", None)
    if isinstance(cause, BaseException):
        e = cause  # a wrapper the driver raises around vLLM's exception
    frames = traceback.extract_tb(e.__traceback__) if e.__traceback__ is not None else []
    if not frames:
        return None
    what = f"{type(e).__name__}: {e}"
    # NIXL's frames are NIXL's: the failure is judged where vLLM called it.
    while frames and _in_nixl(frames[-1]):
        if len(frames) >= 2 and not _in_nixl(frames[-2]) and not _in_driver(frames[-2]):
            return None  # vLLM called NIXL, NIXL refused: vLLM's
        frames = frames[:-1]
    if not frames:
        return None
    inner = frames[-1]
    if _in_driver(inner):
        # The vLLM frame that called into the driver (a patched method), if any.
        above = [f for f in frames[:-1] if not _in_driver(f)]
        vllm_frame = _short(above[-1]) if above else "none (the driver's own call path)"
        if isinstance(e, TypeError) and _MALFORMED_CALL.search(str(e)):
            # Python rejects arguments at the call: the driver's call to
            # vLLM does not fit what this release takes.
            return (f"{what}: vLLM rejected the call the driver made at {_short(inner)}; {_release()}; "
                    f"vLLM frame: {vllm_frame}")
        return f"{what}, raised in {_short(inner)}; {_release()}; vLLM frame: {vllm_frame}"
    if isinstance(e, TypeError) and _MALFORMED_CALL.search(str(e)):
        driver = [i for i, f in enumerate(frames) if _in_driver(f)]
        if driver and driver[-1] >= len(frames) - 2:
            # The driver's call is the last or next-to-last frame: vLLM's
            # callee (or a generated __init__) rejected the arguments.
            caller = frames[driver[-1]]
            callee = frames[driver[-1] + 1] if driver[-1] + 1 < len(frames) else caller
            return (f"{what}: vLLM rejected the call the driver made at {_short(caller)}; {_release()}; "
                    f"vLLM frame: {_short(callee)}")
    return None


def outcome(e, side, message=None):
    """Result fields of a case that ended with `e` on `side`: `crashed`
    (vLLM's own failure, `message` or `Type: text`) or `error` (the
    driver's, naming where)."""
    fault = driver_fault(e)
    trace = "".join(traceback.format_exception(e))
    if fault is not None:
        return {"status": "error", "side": side, "message": f"harness error in the driver: {fault}", "trace": trace}
    return {"status": "crashed", "side": side, "message": message or f"{type(e).__name__}: {e}", "trace": trace}
