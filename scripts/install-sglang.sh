#!/usr/bin/env bash
# Installs SGLang (CPU-only use: its Python transfer code, no kernels) into
# .sglang-venv/ at the project root, for sglang-driver/.
#
# Usage: scripts/install-sglang.sh [--nixl] [--torch-from VENV]
#        scripts/install-sglang.sh --version X [--venv DIR] [--nixl] [--torch-from VENV]
#
# Default release: sglang==0.5.23. --version X installs sglang==X into
# .sglang-venvs/X/ (or --venv DIR) and never touches .sglang-venv/. A release
# that is not on PyPI is exit 2 with pip's reason; so is a release that
# installs but whose modules the driver needs do not import.
#
# What goes in:
# - torch. SGLang pins a CUDA torch (0.5.23: torch==2.14.1). The PyPI build
#   runs on a CPU. Where a vLLM venv of this project already holds a torch
#   (--torch-from VENV, else KVGEOM_TORCH_FROM, else .vllm-venv/ of this
#   checkout, else .vllm-venv/ of the main worktree), its torch and what torch
#   needs (nvidia-* libraries, triton, sympy, ...) are hard-linked into the new
#   venv instead of downloading a second copy of ~5 GB, even when its version
#   differs from SGLang's pin (SGLang is installed with --no-deps, so pip does
#   not object; the driver only runs SGLang's Python planning and copies bytes
#   on the host). Without such a venv, or when hard links are impossible (other
#   file system), torch is SGLang's own pin from PyPI. The torch that was
#   installed, and where it came from, is written to the venv's .kvgeom-torch.
# - sglang==X with --no-deps (its metadata pulls sglang-kernel, flashinfer,
#   flash-attn, deep-gemm, cutlass, nvshmem, tilelang, ...: none is installed).
# - the light packages the driven modules import (transformers,
#   compressed-tensors, torchvision, IPython, msgspec, pyzmq, ...), at the
#   versions SGLang's metadata pins where it pins them, resolved with torch
#   held at the installed version (a constraint), so pip never fetches a
#   second torch. Plus pytest for sglang-driver/test_*.py.
#
# Wheels pip downloads for SGLang itself are kept in .sglang-venvs/.wheels/.
# A second run with nothing changed finds the stamp and returns in seconds.
#
# --nixl also installs NIXL's Python package (nixl==1.5.1 and nixl-cu13==1.5.1,
# both --no-deps), as scripts/install-vllm.sh --nixl does.
set -euo pipefail

DEFAULT_VERSION="0.5.23"
NIXL_VERSION="1.5.1"
NIXL_WHEELS=("nixl==${NIXL_VERSION}" "nixl-cu13==${NIXL_VERSION}")
NIXL_STAMP_TEXT="${NIXL_WHEELS[*]}"
# Imported (at module level) by sglang.srt.disaggregation.nixl.conn, the
# memory pools and the decode/prefill modules, on a CPU. A name SGLang's
# metadata pins gets SGLang's pin.
LIGHT_DEPS=(
    transformers compressed-tensors torchvision pillow ipython dill gguf
    sentencepiece safetensors huggingface_hub tokenizers msgspec numpy pyzmq
    requests aiohttp orjson pybase64 psutil pydantic starlette fastapi regex
    tqdm packaging typing_extensions einops filelock openai partial_json_parser
    setproctitle uvloop xxhash zstandard python-dateutil
    # The TVM FFI runtime (CPU-capable), imported at module level by
    # sglang.kernels.ops.communication through the distributed package.
    apache-tvm-ffi
    # Imported at module level by older releases (0.5.16: through
    # sglang.srt.function_call, reached from the server args).
    xgrammar
    pytest
)
# The modules the driver imports; the install fails (exit 2) when one does not.
CHECK_IMPORTS="sglang.srt.disaggregation.nixl.conn, sglang.srt.disaggregation.common.conn, sglang.srt.disaggregation.base.conn, sglang.srt.disaggregation.utils, sglang.srt.mem_cache.memory_pool, sglang.srt.server_args"
# (not sglang.srt.runtime_context: releases before 0.5.14 have none, and the
# driver adapts to that; sglang-driver/compat.py)

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/disk-space.sh
source "${ROOT}/scripts/disk-space.sh"
START=$(date +%s)

note() {
    echo "install-sglang: $*" >&2
}
die() {
    echo "install-sglang: error: $*" >&2
    exit 1
}
# Bad input, a release not on PyPI, or a release the driver cannot use.
bad() {
    echo "install-sglang: error: $*" >&2
    exit 2
}
elapsed() {
    echo "$(($(date +%s) - START)) s"
}

USAGE="usage: scripts/install-sglang.sh [--version X] [--venv DIR] [--nixl] [--torch-from VENV]"
VERSION=""
OTHER_VENV=""
TORCH_FROM="${KVGEOM_TORCH_FROM:-}"
WITH_NIXL=0
while (($#)); do
    case "$1" in
    --nixl) WITH_NIXL=1 ;;
    --version | --venv | --torch-from)
        (($# >= 2)) && [[ -n "$2" ]] || bad "$1 needs a value (${USAGE})"
        case "$1" in
        --version) VERSION="$2" ;;
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
if [[ -n "${OTHER_VENV}" && -z "${VERSION}" ]]; then
    bad "--venv goes with --version; plain install-sglang.sh always installs .sglang-venv/ (${USAGE})"
fi
if [[ -n "${VERSION}" ]]; then
    [[ "${VERSION}" =~ ^[0-9][0-9A-Za-z.+!-]*$ ]] || bad "--version ${VERSION}: not a release number (e.g. 0.5.23)"
    VENV="${OTHER_VENV:-${ROOT}/.sglang-venvs/${VERSION}}"
else
    VERSION="${DEFAULT_VERSION}"
    VENV="${ROOT}/.sglang-venv"
fi
[[ "${VENV}" == /* ]] || VENV="$(pwd)/${VENV}"
STAMP="${VENV}/.kvgeom-stamp"
NIXL_STAMP="${VENV}/.kvgeom-nixl-stamp"
WHEEL_STORE="${ROOT}/.sglang-venvs/.wheels"

PYTHON="${PYTHON:-python3}"
command -v "${PYTHON}" >/dev/null ||
    die "${PYTHON} not found; install Python 3.11-3.13 (or set PYTHON=/path/to/python3)"
"${PYTHON}" -c 'import sys, venv, ensurepip; assert sys.version_info >= (3, 11)' 2>/dev/null ||
    die "${PYTHON} is older than 3.11 (SGLang needs >= 3.11) or lacks venv/ensurepip (Debian/Ubuntu: apt-get install python3-venv)"

# The venvs live inside the checkout; keep them out of git without touching
# the project's .gitignore (what `python -m venv` does itself from 3.13 on).
ignore_dir() {
    mkdir -p "$1"
    [[ -f "$1/.gitignore" ]] || echo '*' >"$1/.gitignore"
}

install_nixl() {
    local py="${VENV}/bin/python"
    if [[ -f "${NIXL_STAMP}" && "$(cat "${NIXL_STAMP}")" == "${NIXL_STAMP_TEXT}" ]] &&
        "${py}" -c 'import nixl._api' 2>/dev/null; then
        note "NIXL already installed in ${VENV} (${NIXL_STAMP_TEXT}); nothing to do ($(elapsed))"
        return 0
    fi
    note "installing ${NIXL_WHEELS[*]} without their dependencies"
    "${py}" -m pip --disable-pip-version-check install -q --no-deps "${NIXL_WHEELS[@]}" ||
        die "pip could not install ${NIXL_WHEELS[*]}"
    "${py}" -c 'import nixl._api as a; a.nixl_agent' 2>/dev/null ||
        die "${NIXL_WHEELS[*]} were installed but nixl._api does not import; see: ${py} -c 'import nixl._api'"
    echo "${NIXL_STAMP_TEXT}" >"${NIXL_STAMP}"
    note "installed ${NIXL_WHEELS[*]} ($(elapsed))"
}

# The donor venv whose torch is reused: the first that has one.
find_donor() {
    local candidates=()
    [[ -n "${TORCH_FROM}" ]] && candidates+=("${TORCH_FROM}")
    candidates+=("${ROOT}/.vllm-venv")
    local common
    if common="$(git -C "${ROOT}" rev-parse --path-format=absolute --git-common-dir 2>/dev/null)"; then
        candidates+=("$(dirname "${common}")/.vllm-venv")
    fi
    local c
    for c in "${candidates[@]}"; do
        if [[ -x "${c}/bin/python" ]] &&
            "${c}/bin/python" -c 'import importlib.metadata as m, sys; m.version("torch"); assert sys.version_info[:2] == tuple(int(x) for x in sys.argv[1].split("."))' \
                "$("${PYTHON}" -c 'import sys; print("%d.%d" % sys.version_info[:2])')" 2>/dev/null; then
            echo "${c}"
            return 0
        fi
    done
    if [[ -n "${TORCH_FROM}" ]]; then
        note "--torch-from ${TORCH_FROM}: no torch for this Python there; torch comes from PyPI"
    fi
    return 1
}

# link_torch DONOR: torch and its dependency closure hard-linked from DONOR.
# shellcheck source=scripts/link-torch.sh
source "${ROOT}/scripts/link-torch.sh"
# shellcheck source=scripts/uv-install.sh
source "${ROOT}/scripts/uv-install.sh"

# --- the stamp: a rerun with nothing changed returns here ---
STAMP_TEXT="sglang==${VERSION} deps=$(printf '%s ' "${LIGHT_DEPS[@]}" | cksum | cut -d' ' -f1)"
if [[ -f "${STAMP}" && "$(cat "${STAMP}")" == "${STAMP_TEXT}" ]] &&
    "${VENV}/bin/python" -c 'import importlib.metadata as m; assert m.version("sglang") == "'"${VERSION}"'"' 2>/dev/null; then
    note "already installed in ${VENV} (sglang==${VERSION}, $(cat "${VENV}/.kvgeom-torch" 2>/dev/null || echo 'torch unknown')); nothing to do ($(elapsed))"
    if ((WITH_NIXL)); then
        install_nixl
    fi
    exit 0
fi

# --- the SGLang wheel first: a release not on PyPI stops here, nothing made ---
ignore_dir "${ROOT}/.sglang-venvs"
mkdir -p "${WHEEL_STORE}"
LOG="$(mktemp)"
trap 'rm -f "${LOG}"' EXIT
WHEEL="$(ls "${WHEEL_STORE}"/sglang-"${VERSION}"-*.whl 2>/dev/null | head -1 || true)"
if [[ -z "${WHEEL}" ]]; then
    note "downloading the sglang==${VERSION} wheel (no dependencies)"
    if ! "${PYTHON}" -m pip --disable-pip-version-check download -q --no-deps --only-binary=:all: \
        -d "${WHEEL_STORE}" "sglang==${VERSION}" >"${LOG}" 2>&1; then
        if grep -q -e "No matching distribution" -e "Could not find a version" "${LOG}"; then
            bad "sglang==${VERSION} is not on PyPI (as a wheel for this Python and platform); the latest there: $(grep -m1 -e 'from versions:' "${LOG}" | sed -e 's/^.*from versions: //' -e 's/)$//' | tr ',' '\n' | tail -n 6 | tr -d ' ' | paste -sd' ')"
        fi
        echo "install-sglang: error: pip could not download sglang==${VERSION}:" >&2
        tail -n 6 "${LOG}" | sed 's/^/    /' >&2
        exit 2
    fi
    WHEEL="$(ls "${WHEEL_STORE}"/sglang-"${VERSION}"-*.whl | head -1)"
fi

# SGLang's own pins, from the wheel's metadata, for the light packages and torch.
read_pins() {
    "${PYTHON}" - "${WHEEL}" "$@" <<'EOF'
import re, sys, zipfile
wheel, names = sys.argv[1], sys.argv[2:]
with zipfile.ZipFile(wheel) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    text = z.read(meta).decode()
norm = lambda s: re.sub(r"[-_.]+", "-", s).lower()
pins = {}
for line in text.splitlines():
    if not line.startswith("Requires-Dist:"):
        continue
    spec = line.split(":", 1)[1].strip()
    if ";" in spec:
        continue  # extras and platform-conditional pins
    m = re.match(r"([A-Za-z0-9_.\-]+)(\[[^\]]*\])?\s*(.*)$", spec)
    pins[norm(m.group(1))] = m.group(3).replace(" ", "")
for n in names:
    print(n + pins.get(norm(n), ""))
EOF
}
mapfile -t DEPS < <(read_pins "${LIGHT_DEPS[@]}")
TORCH_PIN="$(read_pins torch)"

# --- the venv and torch ---
if [[ ! -x "${VENV}/bin/python" ]]; then
    note "creating the virtual environment ${VENV}"
    "${PYTHON}" -m venv "${VENV}" || bad "${PYTHON} -m venv ${VENV} failed"
fi
ignore_dir "${VENV}"
PIP=("${VENV}/bin/python" -m pip --disable-pip-version-check)
"${PIP[@]}" --version >/dev/null 2>&1 || die "pip does not run in ${VENV}; remove it and retry"

if "${VENV}/bin/python" -c 'import torch' 2>/dev/null; then
    note "torch already in ${VENV}: $(cat "${VENV}/.kvgeom-torch" 2>/dev/null || "${VENV}/bin/python" -c 'import torch; print(torch.__version__)')"
else
    TORCH_SOURCE=""
    if DONOR="$(find_donor)"; then
        note "hard-linking torch and its dependencies from ${DONOR} (SGLang ${VERSION} pins ${TORCH_PIN})"
        if link_torch "${DONOR}"; then
            TORCH_SOURCE="hard-linked from ${DONOR}"
        else
            note "could not hard-link from ${DONOR}; torch comes from PyPI"
        fi
    fi
    if [[ -z "${TORCH_SOURCE}" ]]; then
        note "installing ${TORCH_PIN} from PyPI (~5 GB with its nvidia-* wheels)"
        warn_if_short 14 "${VENV}" "${TORCH_PIN} from PyPI (its wheels, pip's cache of them and ~7 GiB installed)"
        "${PIP[@]}" install -q "${TORCH_PIN}" || bad "pip could not install ${TORCH_PIN} ($(disk_report "${VENV}"))"
        TORCH_SOURCE="from PyPI"
    fi
    "${VENV}/bin/python" -c 'import torch' 2>"${LOG}" || {
        tail -n 4 "${LOG}" >&2
        die "torch does not import in ${VENV}"
    }
    echo "torch $("${VENV}/bin/python" -c 'import torch; print(torch.__version__)' 2>/dev/null) ${TORCH_SOURCE} (sglang==${VERSION} pins ${TORCH_PIN})" >"${VENV}/.kvgeom-torch"
fi
TORCH_HAVE="$("${VENV}/bin/python" -c 'import importlib.metadata as m; print(m.version("torch"))')"

# --- the light packages, torch held where it is ---
CONSTRAINTS="${VENV}/.kvgeom-constraints.txt"
echo "torch==${TORCH_HAVE}" >"${CONSTRAINTS}"
note "installing the light dependencies (${#DEPS[@]} packages; torch held at ${TORCH_HAVE})"
if uv_install "${ROOT}" "${VENV}" "${LOG}" -c "${CONSTRAINTS}" "${DEPS[@]}"; then
    note "light dependencies installed with uv (scripts/uv-install.sh)"
elif ! "${PIP[@]}" install -q -c "${CONSTRAINTS}" "${DEPS[@]}" >"${LOG}" 2>&1; then
    echo "install-sglang: error: pip could not install the light dependencies:" >&2
    tail -n 8 "${LOG}" | sed 's/^/    /' >&2
    exit 2
fi

note "installing sglang==${VERSION} without its dependencies"
"${PIP[@]}" install -q --no-deps "${WHEEL}" >"${LOG}" 2>&1 || {
    tail -n 6 "${LOG}" | sed 's/^/    /' >&2
    bad "pip could not install ${WHEEL}"
}

note "checking that the modules the driver drives import (no GPU kernels)"
if ! "${VENV}/bin/python" -c "import ${CHECK_IMPORTS}" >"${LOG}" 2>&1; then
    echo "install-sglang: error: sglang==${VERSION} was installed but the modules the driver needs do not import:" >&2
    grep -v -e "^\s*$" "${LOG}" | tail -n 6 | sed 's/^/    /' >&2
    exit 2
fi

echo "${STAMP_TEXT}" >"${STAMP}"
note "installed sglang==${VERSION} ($(cat "${VENV}/.kvgeom-torch")) and ${#DEPS[@]} light dependencies in ${VENV} ($(du -sh "${VENV}" | cut -f1) apparent, $(elapsed))"
if ((WITH_NIXL)); then
    install_nixl
fi
