# Sourced by scripts/install-vllm.sh: a vLLM release (--version X, or the
# pinned release into .vllm-venv/ when PINNED_INSTALL=1) or source tree
# (--source DIR) in its own venv under .vllm-venvs/ (never .vllm-venv/ but
# for the pinned release). Uses ROOT, PYTHON, OTHER_VERSION, OTHER_SOURCE,
# OTHER_VENV, TORCH_FROM, PINNED_INSTALL, bad(), note(), elapsed() of the
# caller; sets VENV and NIXL_STAMP for its install_nixl.
#
# Every wheel pip downloads goes to .vllm-venvs/.wheels/ first and is
# installed from there (--no-index), so another venv with the same torch pin
# or the same dependency versions downloads nothing again.

WHEEL_STORE="${ROOT}/.vllm-venvs/.wheels"
# shellcheck source=scripts/uv-install.sh
source "${ROOT}/scripts/uv-install.sh"

# pip in the new venv; its output goes to LOG, which bad() callers cite.
other_pip() {
    "${VENV}/bin/python" -m pip --disable-pip-version-check "$@"
}

# The last lines of pip's log, indented, for an error message.
log_tail() {
    tail -n "${2:-6}" "$1" | sed 's/^/    /'
}

# The exact pins the package index lacks that were replaced, one
# "WANTED -> CHOSEN (why)" a line; written to the venv's .kvgeom-substitutions.
SUBSTITUTIONS=()

# When pip's LOG ($1) says the index has no version matching an exact pin in
# the array named $2, replaces that pin in the array by the version
# scripts/vllm-wheel-deps.py substitutes (same major.minor, else the lowest
# newer), warns in one line and returns 0; otherwise returns 1 (any other
# failure, a transitive requirement, nothing to substitute).
substitute_missing_pin() {
    local log="$1" line req versions chosen i
    local -n subst_reqs="$2"
    line="$({ grep -o -E 'Could not find a version that satisfies the requirement [^ ]+ \(from versions: [^)]*\)' "${log}" || true; } | head -n 1)"
    [[ -n "${line}" ]] || return 1
    req="$(sed -E 's/.*the requirement ([^ ]+) \(from versions.*/\1/' <<<"${line}")"
    versions="$(sed -E 's/.*\(from versions: ([^)]*)\)$/\1/' <<<"${line}" | tr -d ',')"
    for i in "${!subst_reqs[@]}"; do
        [[ "$(canonical_name "${subst_reqs[$i]}")" == "$(canonical_name "${req}")" && "${subst_reqs[$i]}" == *==* ]] || continue
        # shellcheck disable=SC2086 # the versions are one word each
        chosen="$("${VENV}/bin/python" "${ROOT}/scripts/vllm-wheel-deps.py" substitute "${subst_reqs[$i]}" ${versions})" || return 1
        note "warning: ${subst_reqs[$i]} is not on the package index; installing ${chosen} in its place"
        SUBSTITUTIONS+=("${subst_reqs[$i]} -> ${chosen} (the pin is not on the package index)")
        subst_reqs[i]="${chosen}"
        return 0
    done
    return 1
}

# A requirement's project name, lower case, runs of -_. as one -.
canonical_name() {
    local name="${1%%[[<>=!~; ]*}"
    name="${name,,}"
    echo "${name//[_.]/-}"
}

# Downloads REQS into the wheel store (what is there already is not fetched
# again) and installs them from it; an exact pin the index lacks is
# substituted (substitute_missing_pin). $1: --deps or --no-deps; the rest:
# requirements.
store_install() {
    local deps="$1" log tries=0
    shift
    local reqs=("$@")
    log="$(mktemp)"
    local nodeps=()
    [[ "${deps}" == --no-deps ]] && nodeps=(--no-deps)
    until other_pip download -q "${nodeps[@]}" --find-links "${WHEEL_STORE}" -d "${WHEEL_STORE}" "${reqs[@]}" >"${log}" 2>&1; do
        if ((tries++ < 8)) && substitute_missing_pin "${log}" reqs; then continue; fi
        echo "install-vllm: error: pip could not download ${reqs[*]}:" >&2
        log_tail "${log}" >&2
        rm -f "${log}"
        exit 2
    done
    if ! uv_install "${ROOT}" "${VENV}" "${log}" "${nodeps[@]}" --no-index --find-links "${WHEEL_STORE}" "${reqs[@]}" &&
        ! other_pip install -q "${nodeps[@]}" --no-index --find-links "${WHEEL_STORE}" "${reqs[@]}" >"${log}" 2>&1; then
        echo "install-vllm: error: pip could not install ${reqs[*]}:" >&2
        log_tail "${log}" >&2
        rm -f "${log}"
        exit 2
    fi
    # --no-deps leaves vLLM's own requirement list unmet on purpose.
    grep -v -e "requires .*, which is not installed" -e "dependency resolver does not currently" -e "^vllm .* requires" "${log}" >&2 || true
    rm -f "${log}"
}

# The git checkout a source tree is (top folder, HEAD, whether tracked files
# differ from it), as JSON for the venv's .kvgeom-source, which
# vllm-driver/provenance.py reports: the installed package is a copy in
# site-packages, no longer inside the tree. Nothing for a tree without git.
source_record() {
    local dir="$1" top commit dirty=false
    top="$(git -C "${dir}" rev-parse --show-toplevel 2>/dev/null)" || return 0
    commit="$(git -C "${dir}" rev-parse HEAD 2>/dev/null)" || return 0
    [[ -n "$(git -C "${dir}" status --porcelain --untracked-files=no 2>/dev/null)" ]] && dirty=true
    "${PYTHON}" -c 'import json, sys; print(json.dumps({"path": sys.argv[1], "commit": sys.argv[2], "dirty": sys.argv[3] == "true"}))' \
        "${top}" "${commit}" "${dirty}"
}

# A fingerprint of a source tree: its git commit and changes, else the size
# and time of every file (build outputs excluded).
tree_fingerprint() {
    local dir="$1"
    if git -C "${dir}" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
        echo "git=$(git -C "${dir}" rev-parse HEAD 2>/dev/null || echo none) describe=$(git -C "${dir}" describe --tags --always 2>/dev/null || echo none) changes=$({ git -C "${dir}" status --porcelain; git -C "${dir}" diff HEAD; } 2>/dev/null | cksum | cut -d' ' -f1)"
    else
        echo "files=$(cd "${dir}" && find . -path ./build -prune -o -name '*.egg-info' -prune -o -type f -printf '%P %s %T@\n' | sort | cksum | cut -d' ' -f1)"
    fi
}

make_venv() {
    if [[ ! -x "${VENV}/bin/python" ]]; then
        note "creating the virtual environment ${VENV}"
        "${PYTHON}" -m venv "${VENV}" || bad "${PYTHON} -m venv ${VENV} failed"
    fi
    other_pip --version >/dev/null 2>&1 || bad "pip does not run in ${VENV}; remove it and retry"
}

# --torch-from: hard-links the donor's torch into the new venv (once; a
# venv that imports torch already is left as it is). Sets `linked` to how
# torch got there, or leaves it empty when hard links are impossible. $1: the
# pin that would be installed otherwise, for the notes.
linked=""
torch_from_donor() {
    "${TORCH_FROM}/bin/python" -c 'import importlib.metadata as m, sys; m.version("torch"); assert sys.version_info[:2] == tuple(int(x) for x in sys.argv[1].split("."))' \
        "$("${VENV}/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')" 2>/dev/null ||
        bad "--torch-from ${TORCH_FROM}: no torch there for this venv's Python"
    if "${VENV}/bin/python" -c 'import torch' 2>/dev/null; then
        [[ -n "${linked}" ]] || linked="already there"
        return 0
    fi
    # shellcheck source=scripts/link-torch.sh
    source "${ROOT}/scripts/link-torch.sh"
    note "hard-linking torch and its dependencies from ${TORCH_FROM} (the tree or wheel pins $1)"
    if link_torch "${TORCH_FROM}"; then
        linked="hard-linked from ${TORCH_FROM}"
    else
        note "could not hard-link from ${TORCH_FROM}; installing $1"
    fi
}

install_other() {
    local kind what default_venv
    if [[ -n "${OTHER_VERSION}" ]]; then
        [[ "${OTHER_VERSION}" =~ ^[0-9][0-9A-Za-z.+!-]*$ ]] ||
            bad "--version ${OTHER_VERSION}: not a release number (e.g. 0.31.0)"
        kind="release"
        what="vllm==${OTHER_VERSION}"
        default_venv="${ROOT}/.vllm-venvs/${OTHER_VERSION}"
    else
        [[ -d "${OTHER_SOURCE}" ]] || bad "--source ${OTHER_SOURCE}: no such directory"
        OTHER_SOURCE="$(cd "${OTHER_SOURCE}" && pwd)"
        [[ -f "${OTHER_SOURCE}/setup.py" || -f "${OTHER_SOURCE}/pyproject.toml" ]] ||
            bad "--source ${OTHER_SOURCE}: neither setup.py nor pyproject.toml there; not a vLLM source tree"
        [[ -f "${OTHER_SOURCE}/vllm/__init__.py" ]] ||
            bad "--source ${OTHER_SOURCE}: no vllm/__init__.py there; not a vLLM source tree"
        kind="source"
        what="${OTHER_SOURCE} ($(tree_fingerprint "${OTHER_SOURCE}"))"
        default_venv="${ROOT}/.vllm-venvs/src-$(basename "${OTHER_SOURCE}")"
    fi
    VENV="${OTHER_VENV:-${default_venv}}"
    mkdir -p "$(dirname "${VENV}")" || bad "cannot create $(dirname "${VENV}")"
    VENV="$(cd "$(dirname "${VENV}")" && pwd)/$(basename "${VENV}")"
    if [[ "${VENV}" == "${ROOT}/.vllm-venv" ]] && ((!PINNED_INSTALL)); then
        bad "--venv ${VENV}: .vllm-venv/ holds the pinned vLLM ${VLLM_VERSION}; name another folder"
    fi
    STAMP="${VENV}/.kvgeom-stamp"
    NIXL_STAMP="${VENV}/.kvgeom-nixl-stamp"
    local stamp_text="${kind} ${what} filter=$(cksum <"${ROOT}/scripts/vllm-wheel-deps.py" | cut -d' ' -f1)"
    if [[ -n "${TORCH_FROM}" ]]; then
        TORCH_FROM="$(cd "${TORCH_FROM}" && pwd)"
        stamp_text+=" torch-from=${TORCH_FROM}"
    fi

    if [[ -f "${STAMP}" && "$(cat "${STAMP}")" == "${stamp_text}" ]] &&
        "${VENV}/bin/python" -c 'import importlib.metadata as m; m.version("vllm")' 2>/dev/null; then
        note "already installed in ${VENV} (${what}, $(cat "${VENV}/.kvgeom-torch" 2>/dev/null || echo 'torch unknown')); nothing to do ($(elapsed))"
        return 0
    fi

    rm -f "${STAMP}" "${VENV}/.kvgeom-source" "${VENV}/.kvgeom-substitutions"
    mkdir -p "${WHEEL_STORE}"
    local wheels log wheel record=""
    wheels="$(mktemp -d)"
    log="$(mktemp)"
    # shellcheck disable=SC2064
    trap "rm -rf '${wheels}' '${log}'" EXIT
    if [[ "${kind}" == release ]]; then
        note "downloading the ${what} wheel"
        # With the interpreter the venv is made from, before the venv: a
        # release that is not there leaves no folder behind.
        if ! "${PYTHON}" -m pip --disable-pip-version-check download --no-deps --find-links "${WHEEL_STORE}" -d "${WHEEL_STORE}" "${what}" >"${log}" 2>&1; then
            if grep -q -e "No matching distribution" -e "Could not find a version" "${log}"; then
                local known
                known="$({ grep -o 'from versions: .*)' "${log}" || true; } | sed -e 's/^from versions: //' -e 's/)$//' | tr ',' '\n' | tail -n 6 | tr -d ' ' | paste -sd' ' -)"
                bad "${what} is not on PyPI (its latest releases there: ${known:-none listed})"
            fi
            echo "install-vllm: error: pip could not download ${what}:" >&2
            log_tail "${log}" >&2
            exit 2
        fi
        wheel="$({ ls -t "${WHEEL_STORE}"/vllm-"${OTHER_VERSION}"-*.whl 2>/dev/null || true; } | head -n 1)"
        [[ -n "${wheel}" ]] || bad "pip downloaded ${what} but no vllm-${OTHER_VERSION}-*.whl is in ${WHEEL_STORE} (an sdist only? use --source)"
        make_venv
    else
        # setup.py imports torch: install the pin of the tree's build
        # requirements first, with the build tools (no build isolation).
        local torch_pin
        torch_pin="$({ grep -o -E '"torch *== *[0-9][0-9a-z.+]*"' "${OTHER_SOURCE}/pyproject.toml" 2>/dev/null || true; } | head -n 1 | tr -d '" ')"
        [[ -n "${torch_pin}" ]] || torch_pin="$({ grep -h -o -E '^torch *== *[0-9][0-9a-z.+]*' "${OTHER_SOURCE}"/requirements/cuda.txt "${OTHER_SOURCE}"/requirements/build.txt 2>/dev/null || true; } | head -n 1 | tr -d ' ')"
        [[ -n "${torch_pin}" ]] || bad "--source ${OTHER_SOURCE}: no torch==X pin in pyproject.toml or requirements/{cuda,build}.txt; not a vLLM source tree"
        make_venv
        # With --torch-from the donor's torch is linked before the build, so
        # the tree's pin is never installed (its setup.py only imports torch).
        if [[ -n "${TORCH_FROM}" ]]; then torch_from_donor "${torch_pin}"; fi
        if [[ -z "${linked}" ]]; then
            note "installing ${torch_pin} (the tree's setup.py imports torch)"
            store_install --deps "${torch_pin}"
        fi
        note "installing the build tools"
        store_install --deps "setuptools>=77.0.3,<81" "setuptools-scm>=8" setuptools-rust wheel packaging jinja2 cmake ninja
        note "building ${OTHER_SOURCE} Python-only (VLLM_TARGET_DEVICE=empty)"
        record="$(source_record "${OTHER_SOURCE}")"
        # CARGO names no program: the optional Rust frontend of newer trees
        # (vllm-rs, a server binary the driver never runs) is skipped, not
        # compiled.
        if ! VLLM_TARGET_DEVICE=empty CARGO=/nonexistent/cargo other_pip wheel --no-build-isolation --no-deps -w "${wheels}" "${OTHER_SOURCE}" >"${log}" 2>&1; then
            echo "install-vllm: error: ${OTHER_SOURCE} does not build (VLLM_TARGET_DEVICE=empty pip wheel --no-build-isolation --no-deps):" >&2
            log_tail "${log}" 12 >&2
            exit 2
        fi
        wheel="$({ ls "${wheels}"/vllm-*.whl 2>/dev/null || true; } | head -n 1)"
        [[ -n "${wheel}" ]] || bad "${OTHER_SOURCE} built, but no vllm-*.whl came out (not a vLLM tree?)"
    fi

    # The wheel's own requirements, sorted by the CPU filter.
    local plan torch_req deps=() nodeps=()
    plan="$("${VENV}/bin/python" "${ROOT}/scripts/vllm-wheel-deps.py" "${wheel}" 2>"${log}")" ||
        bad "cannot read the requirements of ${wheel}: $(cat "${log}")"
    note "leaving out $(grep -c '^skip' "${log}") GPU-only requirements of the wheel (scripts/vllm-wheel-deps.py)"
    torch_req="$(sed -n 's/^torch //p' <<<"${plan}" | head -n 1)"
    [[ -n "${torch_req}" ]] || torch_req="torch"
    mapfile -t deps < <(sed -n 's/^dep //p' <<<"${plan}")
    mapfile -t nodeps < <(sed -n 's/^nodeps //p' <<<"${plan}")

    local t0
    t0=$(date +%s)
    if [[ -n "${TORCH_FROM}" ]]; then torch_from_donor "${torch_req}"; fi
    if [[ -z "${linked}" ]]; then
        note "installing ${torch_req} (through ${WHEEL_STORE}: a pin installed before is not downloaded again)"
        store_install --deps "${torch_req}"
    fi
    note "torch in $(($(date +%s) - t0)) s"
    note "installing $(basename "${wheel}") without its dependencies"
    # A source tree's wheel keeps its version across changes: reinstall it.
    local force=() uv_force=()
    [[ "${kind}" == source ]] && force=(--force-reinstall) && uv_force=(--reinstall)
    uv_install "${ROOT}" "${VENV}" "${log}" --no-deps "${uv_force[@]}" "${wheel}" ||
        other_pip install -q --no-deps "${force[@]}" "${wheel}" >"${log}" 2>&1 || {
        echo "install-vllm: error: pip could not install ${wheel}:" >&2
        log_tail "${log}" >&2
        exit 2
    }
    note "installing ${#deps[@]} light dependencies from the wheel's metadata"
    if [[ -n "${linked}" ]]; then
        # Torch held at the linked version: pip never fetches the pin.
        local constraints="${VENV}/.kvgeom-constraints.txt"
        echo "torch==$("${VENV}/bin/python" -c 'import importlib.metadata as m; print(m.version("torch"))')" >"${constraints}"
        local tries=0
        if uv_install "${ROOT}" "${VENV}" "${log}" -c "${constraints}" --find-links "${WHEEL_STORE}" "${deps[@]}"; then
            note "light dependencies installed with uv (scripts/uv-install.sh)"
        else
            until other_pip install -q -c "${constraints}" --find-links "${WHEEL_STORE}" "${deps[@]}" >"${log}" 2>&1; do
                if ((tries++ < 8)) && substitute_missing_pin "${log}" deps; then continue; fi
                echo "install-vllm: error: pip could not install the light dependencies:" >&2
                log_tail "${log}" >&2
                exit 2
            done
        fi
    else
        store_install --deps "${deps[@]}"
    fi
    if ((${#nodeps[@]})); then
        note "installing ${nodeps[*]} without their dependencies"
        store_install --no-deps "${nodeps[@]}"
    fi

    note "checking that vLLM's config and KV-cache modules import"
    if ! "${VENV}/bin/python" -c 'import vllm.v1.kv_cache_interface' >"${log}" 2>&1; then
        echo "install-vllm: error: ${what} was installed in ${VENV} but does not import:" >&2
        log_tail "${log}" >&2
        exit 2
    fi
    # The driver's NIXL modules: a release without them installs, and the
    # driver names what it lacks (vllm-driver/api_check.py).
    if ! "${VENV}/bin/python" -c 'import vllm.distributed.kv_transfer.kv_connector.v1.nixl.worker' >"${log}" 2>&1; then
        note "note: vLLM's NIXL worker module does not import in ${VENV}; the driver will refuse it, naming what is missing:"
        grep -E '^[A-Za-z]*(Error|Exception)' "${log}" | tail -n 1 | sed 's/^/    /' >&2
    fi
    local versions
    versions="$("${VENV}/bin/python" -c 'import torch, vllm; print(f"torch=={torch.__version__} vllm=={vllm.__version__}")' 2>/dev/null)" ||
        bad "${VENV}: torch or vllm does not import"
    if [[ -n "${linked}" && "${linked}" != "already there" ]]; then
        echo "${versions%% vllm==*} ${linked} (the wheel pins ${torch_req})" >"${VENV}/.kvgeom-torch"
    elif [[ -z "${linked}" ]]; then
        echo "${versions%% vllm==*}" >"${VENV}/.kvgeom-torch"
    fi
    if ((${#SUBSTITUTIONS[@]})); then
        printf '%s\n' "${SUBSTITUTIONS[@]}" >"${VENV}/.kvgeom-substitutions"
    else
        rm -f "${VENV}/.kvgeom-substitutions"
    fi
    if [[ "${kind}" == source && -n "${record}" ]]; then
        echo "${record}" >"${VENV}/.kvgeom-source"
    fi
    echo "${stamp_text}" >"${STAMP}"
    note "installed ${versions} in ${VENV} ($(du -sh "${VENV}" | cut -f1), $(elapsed))"
    note "then: kvgeom sweep --connector vllm --vllm-python ${VENV}/bin/python ..."
}
