# Sourced by scripts/install-vllm-other.sh and scripts/install-sglang.sh:
# the light dependencies of a venv whose torch is hard-linked, installed
# with uv (https://pypi.org/project/uv/) when it can be had, else left to
# the caller's pip. pip spends about 45 s of CPU a venv resolving and
# byte-compiling the same packages uv installs in about 15 s (measured in
# docs/benchmarks.md, "Installs"); the packages and versions are the ones
# pip would choose (the same requirements, constraints and find-links, the
# highest versions allowed). Any failure of uv (an option it lacks, a pin
# the index lacks, no uv) returns 1 and the caller runs pip as before, so
# pip's messages and the callers' pin substitutions are unchanged.
#
# uv compiles bytecode without listing it in a distribution's RECORD;
# scripts/link-torch.sh links each module's bytecode beside it all the same
# (a venv without torch's .pyc files compiles torch at every driver start:
# about 35 % slower live tests, measured in CI).
#
# uv is installed once, pinned, into .vllm-venvs/.tools/ (KVGEOM_UV names
# another uv binary; KVGEOM_UV=none always uses pip).

UV_VERSION="0.13.10"

# Prints the uv binary to use, installing the pinned one when needed;
# prints nothing (status 1) when there is none.
find_uv() {
    local root="$1" tools
    case "${KVGEOM_UV:-}" in
    none) return 1 ;;
    "") ;;
    *)
        [[ -x "${KVGEOM_UV}" ]] || return 1
        echo "${KVGEOM_UV}"
        return 0
        ;;
    esac
    tools="${root}/.vllm-venvs/.tools"
    if [[ ! -x "${tools}/bin/uv" || "$("${tools}/bin/uv" --version 2>/dev/null)" != "uv ${UV_VERSION}"* ]]; then
        rm -rf "${tools}"
        mkdir -p "${root}/.vllm-venvs"
        "${PYTHON:-python3}" -m venv "${tools}" >/dev/null 2>&1 &&
            "${tools}/bin/python" -m pip --disable-pip-version-check install -q "uv==${UV_VERSION}" >/dev/null 2>&1 || {
            rm -rf "${tools}"
            return 1
        }
    fi
    echo "${tools}/bin/uv"
}

# uv_install ROOT VENV LOG ARGS...: `uv pip install ARGS` into VENV's
# interpreter, byte-compiled like pip's (the drivers never write bytecode),
# without uv's cache (torch is hard-linked, the rest is small), its output
# in LOG. Status 0 when uv installed everything; 1 otherwise (no uv, or uv
# failed: the caller runs pip).
uv_install() {
    local root="$1" venv="$2" log="$3" uv
    shift 3
    uv="$(find_uv "${root}")" || return 1
    # pip's settings from the environment that uv reads under other names:
    # a private index or wheel folder must not be bypassed by uv.
    local settings=()
    [[ -n "${PIP_CERT:-}" && -z "${SSL_CERT_FILE:-}" ]] && settings+=("SSL_CERT_FILE=${PIP_CERT}")
    [[ -n "${PIP_INDEX_URL:-}" ]] && settings+=("UV_INDEX_URL=${PIP_INDEX_URL}")
    [[ -n "${PIP_EXTRA_INDEX_URL:-}" ]] && settings+=("UV_EXTRA_INDEX_URL=${PIP_EXTRA_INDEX_URL}")
    [[ -n "${PIP_FIND_LINKS:-}" ]] && settings+=("UV_FIND_LINKS=${PIP_FIND_LINKS}")
    env "${settings[@]}" UV_NO_CACHE=1 "${uv}" pip install --quiet --python "${venv}/bin/python" --compile-bytecode "$@" >"${log}" 2>&1
}
