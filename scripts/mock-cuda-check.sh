#!/usr/bin/env bash
# Runs kvgeom's device code paths on a machine without a GPU, against a
# host-memory stand-in for the CUDA driver (scripts/mock-cuda/libcuda.c):
# the GPU checks of tests/gpu.rs and the default sweep on "VRAM" compared
# with the host sweep case by case. The stand-in checks every range against
# a live allocation and runs queued work only when it is waited for, so it
# catches kvgeom's addressing and synchronisation mistakes; it says nothing
# about CUDA itself, nor about NIXL or UCX on device memory (UCX sees its
# buffers as host memory and NIXL refuses to register them as VRAM).
#
# Usage: scripts/mock-cuda-check.sh   (needs cargo and a C compiler)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${CARGO_TARGET_DIR:-${ROOT}/target}/mock-cuda"
CC="${CC:-cc}"
command -v "${CC}" >/dev/null || { echo "mock-cuda-check: error: no C compiler (${CC})" >&2; exit 2; }

mkdir -p "${OUT}"
"${CC}" -O2 -shared -fPIC -o "${OUT}/libcuda.so.1" "${ROOT}/scripts/mock-cuda/libcuda.c" -lpthread
export LD_LIBRARY_PATH="${OUT}${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}"

cd "${ROOT}"
cargo test --features cuda --test gpu
cargo run --features cuda -- sweep --memory vram --compare-host geometries >/dev/null
echo "mock-cuda-check: device code paths agree with the host on the stand-in driver"
