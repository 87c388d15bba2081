"""vLLM's handshake compatibility hash as the driver meets it.

Each engine's worker hashes its settings with the release's own
`compute_nixl_compatibility_hash` when it registers its KV caches. The driver
keeps every factor dictionary that function hashes (by wrapping
`vllm.config.utils.hash_factors`, which it calls), so that a mismatch can name
the factors that differ. Push runs vLLM's own `_nixl_handshake`, which
compares the hashes itself; the pull path loads prefill's agent metadata
directly, so `pull_mismatch` makes the comparison `_nixl_handshake` makes before
it decodes the metadata, with the hashes and the flag vLLM computed.
"""

# hash -> the factors that gave it
FACTORS = {}


def capture(utils=None):
    """Record the factors of every hash vLLM computes from now on (`utils`:
    the module whose `hash_factors` vLLM calls, `vllm.config.utils` unless
    given)."""
    if utils is None:
        try:
            import vllm.config.utils as utils
        except ImportError:
            return
    original = getattr(utils, "hash_factors", None)
    if original is None or getattr(original, "kvgeom_records", False):
        return

    def recording(factors, *args, **kwargs):
        digest = original(factors, *args, **kwargs)
        if isinstance(factors, dict):
            FACTORS[digest] = dict(factors)
        return digest

    recording.kvgeom_records = True
    utils.hash_factors = recording


def differing(local_hash, remote_hash, local_side, remote_side):
    """The factors in which two hashes' dictionaries differ, as one line."""
    local, remote = FACTORS.get(local_hash), FACTORS.get(remote_hash)
    if local is None or remote is None:
        return f"factors not recorded (hashes {local_hash} ({local_side}) vs {remote_hash} ({remote_side}))"
    names = sorted(set(local) | set(remote))
    return ", ".join(
        f"{n} {local.get(n)} ({local_side}) vs {remote.get(n)} ({remote_side})"
        for n in names
        if local.get(n) != remote.get(n)
    )


def mismatch_message(local_hash, remote_hash, local_side, remote_side):
    return "NIXL compatibility hash mismatch: " + differing(local_hash, remote_hash, local_side, remote_side)


def pull_mismatch(decode_worker, payload):
    """Why vLLM's `_nixl_handshake` would refuse prefill's handshake payload
    (the check on, `enforce_handshake_compat`, and the hashes different), or
    None. A release whose payload or worker carries no hash checks nothing."""
    remote = getattr(payload, "compatibility_hash", None)
    local = getattr(decode_worker, "compat_hash", None)
    if remote is None or local is None:
        return None
    if getattr(decode_worker, "enforce_compat_hash", True) and remote != local:
        return mismatch_message(local, remote, "decode", "prefill")
    return None


def explain(error):
    """vLLM's own mismatch error (push), with the differing factors named."""
    text = str(error)
    if "compatibility hash mismatch" not in text:
        return None
    import re

    m = re.search(r"Local: (\w+), Remote: (\w+)", text)
    if not m:
        return None
    return differing(m.group(1), m.group(2), "local", "remote")
