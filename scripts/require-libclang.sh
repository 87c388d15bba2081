#!/usr/bin/env bash
# Checks that libclang is installed, as the `nixl` cargo feature needs it at
# build time (nixl-sys generates its bindings with bindgen, which loads
# libclang). Without it the build dies inside nixl-sys's build script with a
# long panic that does not name the package to install; this check says it in
# one line and exits 2.
#
# Usage: scripts/require-libclang.sh          (exit 0 and print the library found)
#        source scripts/require-libclang.sh && require_libclang "my-script"
#
# Where it looks, as bindgen does: $LIBCLANG_PATH, the dynamic linker's cache,
# and the usual library folders (/usr/lib/llvm-*/lib included). libclang-cpp is
# a different library and does not count.
#
# KVGEOM_LIBCLANG_SEARCH_DIRS (colon-separated), when set, replaces the
# dynamic linker's cache and the usual folders: scripts/check-require-libclang.sh
# uses it to play a machine without libclang.

# Prints the path of the first libclang found; returns 1 when there is none.
find_libclang() {
    local dir lib
    local dirs=()
    [[ -n "${LIBCLANG_PATH:-}" ]] && dirs+=("${LIBCLANG_PATH}")
    if [[ -n "${KVGEOM_LIBCLANG_SEARCH_DIRS+set}" ]]; then
        local extra
        IFS=: read -r -a extra <<<"${KVGEOM_LIBCLANG_SEARCH_DIRS}"
        dirs+=("${extra[@]}")
    elif command -v ldconfig >/dev/null; then
        while read -r lib; do
            [[ -e "${lib}" ]] && {
                echo "${lib}"
                return 0
            }
        done < <(ldconfig -p 2>/dev/null | awk '$1 ~ /^libclang(-[0-9.]+)?\.so/ {print $NF}')
    fi
    [[ -n "${KVGEOM_LIBCLANG_SEARCH_DIRS+set}" ]] ||
        dirs+=(/usr/lib/llvm-*/lib /usr/lib/x86_64-linux-gnu /usr/lib/aarch64-linux-gnu /usr/lib64 /usr/lib /usr/local/lib)
    for dir in "${dirs[@]}"; do
        [[ -d "${dir}" ]] || continue
        for lib in "${dir}"/libclang.so* "${dir}"/libclang-[0-9]*.so*; do
            [[ -e "${lib}" ]] && {
                echo "${lib}"
                return 0
            }
        done
    done
    return 1
}

# Exits 2 with one line naming libclang-dev when libclang is missing.
require_libclang() {
    local who="${1:-kvgeom}"
    if ! find_libclang >/dev/null; then
        echo "${who}: error: libclang not found; building with --features nixl needs it (Debian/Ubuntu: apt-get install libclang-dev; or set LIBCLANG_PATH to the folder holding libclang.so)" >&2
        exit 2
    fi
}

if [[ "${BASH_SOURCE[0]}" == "${0}" ]]; then
    set -euo pipefail
    require_libclang "require-libclang"
    find_libclang
fi
