#!/usr/bin/env bash
# Runs kvgeom's device code paths on a machine without a GPU, against a
# host-memory stand-in for the CUDA driver (scripts/mock-cuda/libcuda.c):
# the stand-in's own self-test, the GPU checks of tests/gpu.rs, the default
# sweep on "VRAM" compared with the host sweep case by case, and a sweep
# with a device fault injected, which must end in an error naming it (no
# panic). The stand-in keeps device and host pointers apart, checks every
# range against a live allocation, runs queued work only when it is waited
# for and makes faults sticky, so it catches kvgeom's addressing,
# synchronisation and error-handling mistakes; it says nothing about CUDA
# itself, nor about NIXL or UCX on device memory (UCX sees its buffers as
# host memory and NIXL refuses to register them as VRAM).
#
# Usage: scripts/mock-cuda-check.sh           (needs cargo and a C compiler)
#        scripts/mock-cuda-check.sh --build   (only build the stand-in; prints its folder)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${CARGO_TARGET_DIR:-${ROOT}/target}/mock-cuda"
CC="${CC:-cc}"
command -v "${CC}" >/dev/null || {
    echo "mock-cuda-check: error: no C compiler (${CC})" >&2
    exit 2
}

mkdir -p "${OUT}"
"${CC}" -O2 -Wall -Wextra -Werror -shared -fPIC -o "${OUT}/libcuda.so.1" \
    "${ROOT}/scripts/mock-cuda/libcuda.c" -lpthread
if [[ "${1:-}" == "--build" ]]; then
    echo "${OUT}"
    exit 0
fi
"${CC}" -O2 -Wall -Wextra -Werror -o "${OUT}/selftest" "${ROOT}/scripts/mock-cuda/selftest.c" \
    "${OUT}/libcuda.so.1" -lpthread
export LD_LIBRARY_PATH="${OUT}${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}"
"${OUT}/selftest" 2>"${OUT}/selftest.log" || {
    cat "${OUT}/selftest.log" >&2
    exit 1
}

cd "${ROOT}"
cargo test --features cuda --test gpu
cargo run --features cuda -- sweep --memory vram --compare-host geometries/*.toml >/dev/null

# A device fault mid-sweep: every later CUDA call fails with it (sticky), and
# kvgeom must report it per case and exit non-zero, never panic or hang.
log="${OUT}/fault.log"
status=0
KVGEOM_MOCK_CUDA_FAULT_AT=200 timeout -k 10 300 cargo run --features cuda -- sweep \
    geometries/g1-mla-kda-ppl3-vs-2.toml --memory vram --prompts 5,29 --no-shrink >"${log}" 2>&1 ||
    status=$?
if ((status == 0 || status >= 124)) || grep -q 'panicked' "${log}" ||
    ! grep -q 'CUDA_ERROR_ILLEGAL_ADDRESS' "${log}"; then
    cat "${log}" >&2
    echo "mock-cuda-check: a device fault was not reported as an error (exit ${status})" >&2
    exit 1
fi
echo "mock-cuda-check: device code paths agree with the host on the stand-in driver; a device fault is reported"
