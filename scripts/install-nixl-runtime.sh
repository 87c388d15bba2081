#!/usr/bin/env bash
# Installs the NIXL C runtime (libnixl_capi.so, the UCX backend plugin and a
# bundled UCX) into .nixl-runtime/ at the project root, from the PyPI wheel
# nixl-cu13. No Python is needed afterwards; the `nixl` cargo feature loads
# the library at run time.
#
# Usage: scripts/install-nixl-runtime.sh [path/to/nixl_cu13-1.5.1-*.whl]
#
# Without an argument the wheel is fetched with `pip download --no-deps`.
# Running it again is cheap: an intact installation is kept as it is.
# Then: source .nixl-runtime/env.sh
set -euo pipefail

NIXL_WHEEL_NAME="nixl-cu13"
NIXL_WHEEL_VERSION="1.5.1"
STAMP_TEXT="${NIXL_WHEEL_NAME}==${NIXL_WHEEL_VERSION}"

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="${ROOT}/.nixl-runtime"
LIBS_DIR_NAME=".nixl_cu13.mesonpy.libs"
DEPS_DIR_NAME="nixl_cu13.libs"

die() {
    echo "install-nixl-runtime: error: $*" >&2
    exit 1
}

note() {
    echo "install-nixl-runtime: $*" >&2
}

# Every library that a UCX-only NIXL agent loads must resolve.
check_resolves() {
    local dir="$1" lib missing
    for lib in "${dir}/${LIBS_DIR_NAME}/libnixl_capi.so" \
        "${dir}/${LIBS_DIR_NAME}/plugins/libplugin_UCX.so"; do
        [[ -f "${lib}" ]] || {
            echo "missing ${lib}"
            return 1
        }
        missing="$(ldd "${lib}" 2>&1 | grep -E 'not found|No such file' || true)"
        if [[ -n "${missing}" ]]; then
            echo "unresolved libraries for ${lib}:"
            echo "${missing}"
            return 1
        fi
    done
}

# env.sh: host memory. env-gpu.sh: the same plus UCX's CUDA transports and
# the CUDA 13 runtime's folder, for device memory (VRAM).
write_env() {
    local dir="$1"
    cat >"${dir}/env.sh" <<ENV
# shellcheck shell=sh
# NIXL runtime for kvgeom (${STAMP_TEXT}), host memory; source this file.
# For device memory (VRAM) source env-gpu.sh instead.
export LD_LIBRARY_PATH="${DEST}/${LIBS_DIR_NAME}\${LD_LIBRARY_PATH:+:\${LD_LIBRARY_PATH}}"
export NIXL_PLUGIN_DIR="${DEST}/${LIBS_DIR_NAME}/plugins"
# In-process agents talk over loopback TCP and shared memory.
export UCX_TLS=tcp,sm,self
export UCX_NET_DEVICES=lo
ENV
    cat >"${dir}/env-gpu.sh" <<'ENV'
# shellcheck shell=sh
# NIXL runtime for kvgeom on device memory (VRAM); source this file.
# UCX_TLS is an allow-list: without cuda_copy UCX takes device memory for
# host memory and NIXL refuses to register it ("VRAM memory is detected as
# host by UCX"); cuda_ipc moves it between processes. UCX's CUDA modules
# need libcuda.so.1 and libnvidia-ml.so.1 (driver) and libcudart.so.13
# (CUDA 13 runtime, added below from CUDA_HOME or /usr/local/cuda-13*).
ENV
    cat >>"${dir}/env-gpu.sh" <<ENV
# shellcheck source=/dev/null
. "${DEST}/env.sh"
ENV
    cat >>"${dir}/env-gpu.sh" <<'ENV'
export UCX_TLS=tcp,sm,self,cuda_copy,cuda_ipc
for kvgeom_cudart in ${CUDA_HOME:+"${CUDA_HOME}/targets/x86_64-linux/lib" "${CUDA_HOME}/lib64"} \
    /usr/local/cuda-13*/targets/x86_64-linux/lib /usr/local/cuda/targets/x86_64-linux/lib; do
    if [ -e "${kvgeom_cudart}/libcudart.so.13" ]; then
        export LD_LIBRARY_PATH="${LD_LIBRARY_PATH}:${kvgeom_cudart}"
        break
    fi
done
unset kvgeom_cudart
ENV
}

print_env() {
    echo "NIXL runtime ready in ${DEST}; to use it:"
    echo "  source ${DEST}/env.sh       # host memory"
    echo "  source ${DEST}/env-gpu.sh   # device memory (VRAM): also UCX's CUDA transports"
    echo "env.sh sets:"
    sed -n 's/^export /  /p' "${DEST}/env.sh"
}

# The runtime is for builds with --features nixl, which need libclang.
# shellcheck source=require-libclang.sh
source "$(dirname "${BASH_SOURCE[0]}")/require-libclang.sh"
require_libclang "install-nixl-runtime"

command -v ldd >/dev/null || die "ldd is required (package libc-bin)"
command -v unzip >/dev/null || command -v python3 >/dev/null ||
    die "unzip or python3 is required to unpack the wheel"

[[ $# -le 1 ]] || die "usage: $0 [path/to/nixl_cu13-${NIXL_WHEEL_VERSION}-*.whl]"
WHEEL="${1:-}"
if [[ -n "${WHEEL}" ]]; then
    [[ -f "${WHEEL}" ]] || die "wheel not found: ${WHEEL}"
    case "$(basename "${WHEEL}")" in
    nixl_cu13-${NIXL_WHEEL_VERSION}-*.whl) ;;
    *) die "expected a ${STAMP_TEXT} wheel (nixl_cu13-${NIXL_WHEEL_VERSION}-*.whl), got $(basename "${WHEEL}")" ;;
    esac
    WHEEL="$(cd "$(dirname "${WHEEL}")" && pwd)/$(basename "${WHEEL}")"
fi

# An intact installation is kept; the env file is rewritten in case the
# project moved.
if [[ -f "${DEST}/.installed" ]] && [[ "$(cat "${DEST}/.installed")" == "${STAMP_TEXT}" ]] &&
    check_resolves "${DEST}" >/dev/null; then
    write_env "${DEST}"
    note "already installed (${STAMP_TEXT})"
    print_env
    exit 0
fi

WORK="$(mktemp -d "${TMPDIR:-/tmp}/nixl-runtime.XXXXXX")"
trap 'rm -rf "${WORK}"' EXIT

if [[ -n "${WHEEL}" ]]; then
    note "using local wheel ${WHEEL}"
else
    PIP=()
    if command -v pip3 >/dev/null; then
        PIP=(pip3)
    elif command -v pip >/dev/null; then
        PIP=(pip)
    elif command -v python3 >/dev/null && python3 -m pip --version >/dev/null 2>&1; then
        PIP=(python3 -m pip)
    else
        die "pip is needed to download ${STAMP_TEXT}; install pip or pass a wheel path"
    fi
    note "downloading ${STAMP_TEXT} (about 60 MB, no dependencies)"
    # The wheel is pinned to one platform tag so that any local Python
    # version gets the same C runtime.
    "${PIP[@]}" download --no-deps --only-binary=:all: \
        --platform manylinux_2_28_x86_64 --python-version 3.11 \
        "${STAMP_TEXT}" -d "${WORK}/download" >&2 ||
        die "pip download of ${STAMP_TEXT} failed (no network or no package index?)"
    WHEEL="$(find "${WORK}/download" -maxdepth 1 -name "nixl_cu13-${NIXL_WHEEL_VERSION}-*.whl" | head -n1)"
    [[ -n "${WHEEL}" ]] || die "pip download finished but left no nixl_cu13 wheel in ${WORK}/download"
fi

STAGE="${WORK}/runtime"
mkdir -p "${STAGE}"
note "unpacking $(basename "${WHEEL}")"
if command -v unzip >/dev/null; then
    unzip -q "${WHEEL}" "${LIBS_DIR_NAME}/*" "${DEPS_DIR_NAME}/*" -d "${STAGE}" ||
        die "could not unpack ${WHEEL}"
else
    python3 - "${WHEEL}" "${STAGE}" "${LIBS_DIR_NAME}/" "${DEPS_DIR_NAME}/" <<'PY' ||
import sys, zipfile
wheel, dest, *prefixes = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    z.extractall(dest, [n for n in z.namelist() if n.startswith(tuple(prefixes))])
PY
        die "could not unpack ${WHEEL}"
fi
[[ -f "${STAGE}/${LIBS_DIR_NAME}/libnixl_capi.so" ]] ||
    die "${WHEEL} has no ${LIBS_DIR_NAME}/libnixl_capi.so; is it the right wheel?"

# Trim what a UCX agent never loads: other backend plugins, telemetry and
# tracing plugins, cloud storage clients and their TLS/HTTP/XML stacks.
note "trimming plugins and libraries UCX does not need"
for plugin_dir in "${STAGE}/${LIBS_DIR_NAME}/plugins" "${STAGE}/${DEPS_DIR_NAME}/nixl"; do
    [[ -d "${plugin_dir}" ]] || continue
    find "${plugin_dir}" -maxdepth 1 -type f -name '*.so*' \
        ! -name 'libplugin_UCX.so' ! -name 'libplugin_POSIX.so' -delete
done
find "${STAGE}/${DEPS_DIR_NAME}" -maxdepth 1 -type f \( \
    -name 'libaws-*' -o -name 'libazure-*' -o -name 'libcurl-*' -o -name 'libxml2-*' \
    -o -name 'libgusli*' -o -name 'libs2n-*' \) -delete
find "${STAGE}/${DEPS_DIR_NAME}/ucx" -maxdepth 1 -type f \( -name '*.la' -o -name 'libucx_perftest*' \) -delete 2>/dev/null || true
chmod -R u+rwX "${STAGE}"

if ! report="$(check_resolves "${STAGE}")"; then
    die "the trimmed runtime does not load: ${report}"
fi

# Swap the new installation in.
rm -rf "${DEST}"
mv "${STAGE}" "${DEST}"
echo "${STAMP_TEXT}" >"${DEST}/.installed"
write_env "${DEST}"
note "installed $(du -sh "${DEST}" | cut -f1) into ${DEST}"
print_env
