#!/usr/bin/env bash
# Installs vLLM (CPU-only use: its Python functions and its NIXL connector's
# workers, no kernels) into a venv, for kvgeom's live drivers
# (vllm-driver/), scripts/vllm-derive-reference.py and the reference tests.
#
# Usage: scripts/install-vllm.sh [--nixl]
#        scripts/install-vllm.sh --version X [--venv DIR] [--nixl] [--torch-from VENV]
#        scripts/install-vllm.sh --source DIR [--venv DIR] [--nixl] [--torch-from VENV]
#
# Plain: the pinned release, vllm==0.34.0, into .vllm-venv/ at the project
# root. --version X installs the release vllm==X from PyPI into
# .vllm-venvs/X/ (or --venv DIR); --source DIR installs a vLLM git checkout
# or unpacked sdist, Python only (VLLM_TARGET_DEVICE=empty, pip
# --no-build-isolation --no-deps), into .vllm-venvs/src-<name>/. Neither
# touches .vllm-venv/. Each takes the torch pin and the light dependencies
# from the vllm wheel's own metadata (Requires-Dist, filtered by
# scripts/vllm-wheel-deps.py to what CPU-side import needs), and keeps every
# wheel it downloads in .vllm-venvs/.wheels/, so a second venv with the same
# torch pin downloads no torch. The torch that was installed is written to
# the venv's .kvgeom-torch. An exact pin the package index lacks (0.34.0's
# flashinfer-python==0.7.3) is replaced by the nearest version the index has,
# with a warning, and listed in the venv's .kvgeom-substitutions. A release
# not on PyPI, a tree that does not build, or a vLLM that does not import is
# exit 2.
#
# --torch-from VENV (with --version or --source): instead of the wheel's own
# torch pin, hard-link the torch of VENV (e.g. .vllm-venv/, torch 2.14.0) and
# its installed dependencies (nvidia-*, triton, sympy, ...) into the new venv,
# as scripts/install-sglang.sh does: no second torch (~5 GB in the venv, and
# its wheel in .vllm-venvs/.wheels/ when the pin is new) is installed. The
# light dependencies are resolved with torch held at that version. vLLM then
# runs on a torch other than its pin: docs/compatibility.md says on which
# release the driver's verdicts were checked to be the same. VENV must run
# the same Python minor version; where hard links are impossible (another
# file system) the pin is installed as without the option.
#
# The pinned install downloads a few GB the first time (torch 2.14.0 and its
# nvidia-* wheels, from PyPI); a second run finds the stamp and returns in
# seconds. Nothing is fetched when vLLM's functions are run afterwards.
#
# --nixl also installs NIXL's Python package (nixl==1.5.1, and nixl-cu13==1.5.1
# with the C runtime and a bundled UCX; both --no-deps, ~60 MB download), so
# that `kvgeom sweep --connector vllm --nixl real` gives vLLM's workers real
# NIXL agents. nixl-cu13, not nixl-cu12: the `nixl` package picks the wheel of
# torch's CUDA major, and torch 2.14.0 from PyPI is built for CUDA 13. A rerun
# finds its own stamp and returns at once.
set -euo pipefail

VLLM_VERSION="0.34.0"
NIXL_VERSION="1.5.1"
NIXL_WHEELS=("nixl==${NIXL_VERSION}" "nixl-cu13==${NIXL_VERSION}")
NIXL_STAMP_TEXT="${NIXL_WHEELS[*]}"

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/disk-space.sh
source "${ROOT}/scripts/disk-space.sh"
VENV="${ROOT}/.vllm-venv"
NIXL_STAMP="${VENV}/.kvgeom-nixl-stamp"
START=$(date +%s)

die() {
    echo "install-vllm: error: $*" >&2
    exit 1
}

note() {
    echo "install-vllm: $*" >&2
}

elapsed() {
    echo "$(($(date +%s) - START)) s"
}

USAGE="usage: scripts/install-vllm.sh [--nixl] | --version X [--venv DIR] [--nixl] [--torch-from VENV] | --source DIR [--venv DIR] [--nixl] [--torch-from VENV]"
# Bad input to --version / --source / --venv: exit 2 with the reason.
bad() {
    echo "install-vllm: error: $*" >&2
    exit 2
}

WITH_NIXL=0
PINNED_INSTALL=0
OTHER_VERSION=""
OTHER_SOURCE=""
OTHER_VENV=""
TORCH_FROM=""
while (($#)); do
    case "$1" in
    --nixl) WITH_NIXL=1 ;;
    --version | --source | --venv | --torch-from)
        (($# >= 2)) && [[ -n "$2" ]] || bad "$1 needs a value (${USAGE})"
        case "$1" in
        --version) OTHER_VERSION="$2" ;;
        --source) OTHER_SOURCE="$2" ;;
        --venv) OTHER_VENV="$2" ;;
        --torch-from) TORCH_FROM="$2" ;;
        esac
        shift
        ;;
    -h | --help)
        sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'
        exit 0
        ;;
    *) bad "unknown option $1 (${USAGE})" ;;
    esac
    shift
done
if [[ -n "${OTHER_VERSION}" && -n "${OTHER_SOURCE}" ]]; then
    bad "--version and --source exclude each other (${USAGE})"
fi
if [[ -n "${OTHER_VENV}" && -z "${OTHER_VERSION}${OTHER_SOURCE}" ]]; then
    bad "--venv goes with --version or --source; plain install-vllm.sh always installs .vllm-venv/ (${USAGE})"
fi
if [[ -n "${TORCH_FROM}" && -z "${OTHER_VERSION}${OTHER_SOURCE}" ]]; then
    bad "--torch-from goes with --version or --source; plain install-vllm.sh installs its pinned torch (${USAGE})"
fi
if [[ -n "${TORCH_FROM}" && ! -x "${TORCH_FROM}/bin/python" ]]; then
    bad "--torch-from ${TORCH_FROM}: no venv there (no bin/python)"
fi

# The nixl wheels, into a venv that has vLLM (idempotent: a matching stamp
# and an importable nixl._api return at once).
install_nixl() {
    local py="${VENV}/bin/python"
    if [[ -f "${NIXL_STAMP}" && "$(cat "${NIXL_STAMP}")" == "${NIXL_STAMP_TEXT}" ]] &&
        "${py}" -c 'import nixl._api' 2>/dev/null; then
        note "NIXL already installed in ${VENV} (${NIXL_STAMP_TEXT}); nothing to do ($(elapsed))"
        return 0
    fi
    note "installing ${NIXL_WHEELS[*]} without their dependencies (torch and numpy are in the venv)"
    "${py}" -m pip --disable-pip-version-check install -q --no-deps "${NIXL_WHEELS[@]}" ||
        die "pip could not install ${NIXL_WHEELS[*]}"
    "${py}" -c 'import nixl._api as a; a.nixl_agent' 2>/dev/null ||
        die "${NIXL_WHEELS[*]} were installed but nixl._api does not import; see: ${py} -c 'import nixl._api'"
    echo "${NIXL_STAMP_TEXT}" >"${NIXL_STAMP}"
    # Two agents moving a few bytes: UCX may not start on every machine.
    if (cd "${ROOT}/vllm-driver" && "${py}" -B real_nixl.py --probe >/dev/null 2>&1); then
        note "installed ${NIXL_WHEELS[*]}; two NIXL agents moved host memory over UCX ($(elapsed))"
    else
        note "installed ${NIXL_WHEELS[*]}, but two NIXL agents could not move host memory here;"
        note "  see: (cd vllm-driver && ${py} -B real_nixl.py --probe); where UCX fails to start, set UCX_TLS=tcp,sm,self UCX_NET_DEVICES=lo"
    fi
}

PYTHON="${PYTHON:-python3}"
command -v "${PYTHON}" >/dev/null ||
    die "${PYTHON} not found; install Python 3.10-3.13 (or set PYTHON=/path/to/python3)"
"${PYTHON}" -c 'import venv, ensurepip' 2>/dev/null ||
    die "${PYTHON} lacks the venv/ensurepip modules (Debian/Ubuntu: apt-get install python3-venv)"

# shellcheck source=scripts/install-vllm-other.sh
source "${ROOT}/scripts/install-vllm-other.sh"
if [[ -z "${OTHER_VERSION}${OTHER_SOURCE}" ]]; then
    # The pinned release, into .vllm-venv/, from its wheel's metadata.
    OTHER_VERSION="${VLLM_VERSION}"
    OTHER_VENV="${VENV}"
    PINNED_INSTALL=1
fi
install_other
if ((WITH_NIXL)); then
    install_nixl
fi
if ((PINNED_INSTALL)); then
    note "then: scripts/vllm-derive-reference.py --help, or cargo test --test project derive::"
fi
