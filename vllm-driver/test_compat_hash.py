"""compat_hash.py: the factors of vLLM's handshake compatibility hash named
where two engines' hashes differ, and the pull path's comparison made as
vLLM's `_nixl_handshake` makes it (the check on, the hashes different).

Run: python -m pytest vllm-driver/test_compat_hash.py (no vLLM needed: a
stand-in `hash_factors` takes vLLM's place, which the driver wraps the same
way).
"""

import hashlib
import os
import sys
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import compat_hash  # noqa: E402


# A stand-in for `vllm.config.utils`: a digest of the factors, as vLLM's is.
UTILS = SimpleNamespace(hash_factors=lambda factors: hashlib.sha256(repr(sorted(factors.items())).encode()).hexdigest())
compat_hash.capture(UTILS)


def _hash(factors):
    return UTILS.hash_factors(factors)


def test_a_mismatch_names_the_factors_vllm_hashed_differently():
    prefill = _hash({"model": "m", "attn_backend_name": "FLASHINFER", "cache_dtype": "auto"})
    decode = _hash({"model": "m", "attn_backend_name": "FLASH_ATTN", "cache_dtype": "auto"})
    assert prefill != decode
    assert compat_hash.differing(decode, prefill, "decode", "prefill") == (
        "attn_backend_name FLASH_ATTN (decode) vs FLASHINFER (prefill)"
    )


def test_pull_refuses_only_with_the_check_on_and_the_hashes_different():
    a = _hash({"attn_backend_name": "FLASHINFER"})
    b = _hash({"attn_backend_name": "FLASH_ATTN"})
    payload = SimpleNamespace(compatibility_hash=a)
    refused = compat_hash.pull_mismatch(SimpleNamespace(compat_hash=b, enforce_compat_hash=True), payload)
    assert refused.startswith("NIXL compatibility hash mismatch: attn_backend_name")
    assert compat_hash.pull_mismatch(SimpleNamespace(compat_hash=b, enforce_compat_hash=False), payload) is None
    assert compat_hash.pull_mismatch(SimpleNamespace(compat_hash=a, enforce_compat_hash=True), payload) is None
    # A release whose payload carries no hash checks nothing.
    assert compat_hash.pull_mismatch(SimpleNamespace(compat_hash=b, enforce_compat_hash=True), SimpleNamespace()) is None


def test_vllms_own_push_error_gets_the_factors():
    a = _hash({"attn_backend_name": "FLASHMLA"})
    b = _hash({"attn_backend_name": "CUTLASS_MLA"})
    error = RuntimeError(f"NIXL compatibility hash mismatch. Local: {a}, Remote: {b}. Prefill and decode ...")
    assert compat_hash.explain(error) == "attn_backend_name FLASHMLA (local) vs CUTLASS_MLA (remote)"
    assert compat_hash.explain(RuntimeError("something else")) is None
