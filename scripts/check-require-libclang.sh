#!/usr/bin/env bash
# Checks the libclang check (scripts/require-libclang.sh) on a machine that
# has libclang or not: a library in $LIBCLANG_PATH is found; libclang-cpp
# does not count; with no libclang anywhere it searches, `require_libclang`,
# `scripts/install-nixl-runtime.sh` and `scripts/gpu-check.sh pack` exit 2
# with one line naming libclang-dev, before building or downloading
# anything (a pack folder is not created). The machine's own folders are hidden with
# KVGEOM_LIBCLANG_SEARCH_DIRS.
#
# Usage: scripts/check-require-libclang.sh   (exit 0 when every check holds)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "${work}"' EXIT
failures=0

fail() {
    echo "check-require-libclang: FAIL: $*" >&2
    failures=$((failures + 1))
}

# Runs "$@" with no libclang visible; expects exit 2 and one stderr line
# naming libclang-dev, and nothing written under the destination.
expect_refusal() {
    local name="$1"
    shift
    local rc=0
    KVGEOM_LIBCLANG_SEARCH_DIRS="${work}/empty" LIBCLANG_PATH="" \
        "$@" >"${work}/${name}.out" 2>"${work}/${name}.err" || rc=$?
    [[ ${rc} -eq 2 ]] || fail "${name}: exit ${rc}, expected 2 (stderr: $(head -c 400 "${work}/${name}.err"))"
    grep -q "libclang-dev" "${work}/${name}.err" || fail "${name}: stderr does not name libclang-dev"
    local lines
    lines=$(grep -c . "${work}/${name}.err" || true)
    [[ ${lines} -eq 1 ]] || fail "${name}: ${lines} lines on stderr, expected one"
}

mkdir -p "${work}/empty" "${work}/llvm" "${work}/cpp-only"
: >"${work}/llvm/libclang.so.1"
: >"${work}/cpp-only/libclang-cpp.so.18"

# shellcheck source=require-libclang.sh
source "${ROOT}/scripts/require-libclang.sh"

found=$(KVGEOM_LIBCLANG_SEARCH_DIRS="${work}/empty" LIBCLANG_PATH="${work}/llvm" find_libclang) ||
    fail "a libclang in LIBCLANG_PATH is not found"
[[ "${found:-}" == "${work}/llvm/libclang.so.1" ]] || fail "found '${found:-}', expected ${work}/llvm/libclang.so.1"

if KVGEOM_LIBCLANG_SEARCH_DIRS="${work}/cpp-only" LIBCLANG_PATH="" find_libclang >/dev/null; then
    fail "libclang-cpp alone is taken for libclang"
fi
if KVGEOM_LIBCLANG_SEARCH_DIRS="${work}/empty" LIBCLANG_PATH="" find_libclang >/dev/null; then
    fail "libclang found with every folder hidden"
fi

expect_refusal require-libclang bash "${ROOT}/scripts/require-libclang.sh"
# A wheel that does not exist: past the check the script would stop with
# exit 1 ("wheel not found") without touching .nixl-runtime/.
expect_refusal install-nixl-runtime bash "${ROOT}/scripts/install-nixl-runtime.sh" \
    "${work}/nixl_cu13-1.5.1-none.whl"
expect_refusal gpu-check-pack bash "${ROOT}/scripts/gpu-check.sh" pack "${work}/pack-dest"
[[ ! -e "${work}/pack-dest" ]] || fail "gpu-check pack wrote ${work}/pack-dest before refusing"

if ((failures)); then
    echo "check-require-libclang: ${failures} check(s) failed" >&2
    exit 1
fi
echo "check-require-libclang: ok (found, libclang-cpp ignored, three scripts refuse naming libclang-dev)"
