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
#
# MOCK_CUDA_FEATURES (default "cuda") is the cargo feature list it builds
# with; CI sets "nixl,cuda", the list its other feature builds use, so that
# kvgeom is compiled once for all of them (the dev profile, and the
# kvgeom binary the test build makes, for the same reason).
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

FEATURES="${MOCK_CUDA_FEATURES:-cuda}"
[[ ",${FEATURES}," == *",cuda,"* ]] || {
    echo "mock-cuda-check: error: MOCK_CUDA_FEATURES=${FEATURES} lacks cuda" >&2
    exit 2
}
cd "${ROOT}"
# With nixl among the features, tests/gpu.rs also holds the real-NIXL tests
# on device memory, which the stand-in cannot pass (NIXL refuses its
# "VRAM", see above): they are left out here by name, and run on a GPU.
skip=()
[[ ",${FEATURES}," == *",nixl,"* ]] && skip=(-- --skip nixl)
cargo test --profile dev --features "${FEATURES}" --test gpu "${skip[@]}"
# The binary cargo built for that integration test (its dependency
# features: a `cargo run` would compile the library again without the
# dev-dependencies' features).
KVGEOM="${CARGO_TARGET_DIR:-${ROOT}/target}/debug/kvgeom"
[[ -x "${KVGEOM}" ]] || {
    echo "mock-cuda-check: error: cargo test --test gpu built no ${KVGEOM}" >&2
    exit 1
}
"${KVGEOM}" sweep --memory vram --compare-host geometries/*.toml >/dev/null

# A device fault mid-sweep: every later CUDA call fails with it (sticky), and
# kvgeom must report it per case and exit non-zero, never panic or hang.
log="${OUT}/fault.log"
status=0
KVGEOM_MOCK_CUDA_FAULT_AT=200 timeout -k 10 300 "${KVGEOM}" sweep \
    geometries/g1-mla-kda-ppl3-vs-2.toml --memory vram --prompts 5,29 --no-shrink >"${log}" 2>&1 ||
    status=$?
if ((status == 0 || status >= 124)) || grep -q 'panicked' "${log}" ||
    ! grep -q 'CUDA_ERROR_ILLEGAL_ADDRESS' "${log}"; then
    cat "${log}" >&2
    echo "mock-cuda-check: a device fault was not reported as an error (exit ${status})" >&2
    exit 1
fi
echo "mock-cuda-check: device code paths agree with the host on the stand-in driver; a device fault is reported"
