#!/usr/bin/env bash
# Takes a new vLLM release through kvgeom in one command, and writes a
# draft page of what changed against the pinned release.
#
# Usage: scripts/new-vllm-release.sh X [--against PYTHON] [--out DIR]
#            [--venv DIR] [--store DIR] [--kvgeom PATH] [--skip-matrix]
#
# X is a release on PyPI (e.g. 0.34.0). Five stages, each timed:
#
# 1. install: scripts/install-vllm.sh --version X --torch-from .vllm-venv
#    into .vllm-venvs/X/ (or --venv DIR); a venv already installed is
#    found by its stamp and returns at once.
# 2. check: the driver's API shape check (vllm-driver/api_check.py, what
#    `kvgeom sweep --connector vllm` runs before any case): every name,
#    constructor keyword, patched signature and post-process entry type the
#    driver needs from X, for pull and push and both request paths.
# 3. sample: a live sweep of four geometries at prompts 5 and 13
#    (scheduler-made requests, as `kvgeom sweep --connector vllm` does):
#    OUT/sample.json.
# 4. matrix: `kvgeom matrix` of X against the pinned release (--against
#    PYTHON, default .vllm-venv/bin/python) over geometries/*.toml, each
#    release's report kept in --store DIR (default target/matrix-run), so
#    a release already run there with the same cases is read back:
#    OUT/matrix.json and OUT/matrix.txt. --skip-matrix leaves it out (a
#    first look in minutes; the page then lists no changed verdicts).
# 5. page: OUT/vllm-X.md (scripts/new-vllm-release-page.py), a draft with
#    the NIXL connector (handshake) version of both releases, the NIXL
#    connector files that changed between the two installed packages (by
#    SHA-256), the cells and cases whose verdict changed, and the time of
#    each stage.
#
# OUT is --out DIR (default target/new-vllm-release/X). Exit 2, with the
# reason, on bad arguments, a release that is not on PyPI or does not
# install, a release the driver's shape check refuses (the pieces named),
# or a sample sweep or matrix the driver could not run (the page is still
# written); else 0. Verdicts that differ from an expectations file are in
# the page, not the exit status: a new release has none yet.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
USAGE="usage: scripts/new-vllm-release.sh X [--against PYTHON] [--out DIR] [--venv DIR] [--store DIR] [--kvgeom PATH] [--skip-matrix]"
SAMPLE_GEOMETRIES=(
    geometries/llama-gqa-prefix-cache.toml
    geometries/gqa-prefill-logical-larger.toml
    geometries/g1-mla-kda-ppl3-vs-2.toml
    geometries/mla-kda-prefill-kernel-larger.toml
)
SAMPLE_PROMPTS="5,13"

bad() {
    echo "new-vllm-release: error: $*" >&2
    exit 2
}

note() {
    echo "new-vllm-release: $*" >&2
}

VERSION=""
AGAINST=".vllm-venv/bin/python"
OUT=""
VENV=""
STORE="target/matrix-run"
KVGEOM="${KVGEOM:-target/debug/kvgeom}"
SKIP_MATRIX=0
while (($#)); do
    case "$1" in
    -h | --help)
        sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'
        exit 0
        ;;
    --against | --out | --venv | --store | --kvgeom)
        (($# >= 2)) && [[ -n "$2" ]] || bad "$1 needs a value (${USAGE})"
        case "$1" in
        --against) AGAINST="$2" ;;
        --out) OUT="$2" ;;
        --venv) VENV="$2" ;;
        --store) STORE="$2" ;;
        --kvgeom) KVGEOM="$2" ;;
        esac
        shift
        ;;
    --skip-matrix) SKIP_MATRIX=1 ;;
    -*) bad "unknown option $1 (${USAGE})" ;;
    *)
        [[ -z "${VERSION}" ]] || bad "one release at a time: ${VERSION} and $1 (${USAGE})"
        VERSION="$1"
        ;;
    esac
    shift
done
[[ -n "${VERSION}" ]] || bad "which release? (${USAGE})"
[[ "${VERSION}" =~ ^[0-9]+\.[0-9]+\.[0-9]+((rc|a|b)[0-9]+|\.post[0-9]+)?$ ]] ||
    bad "${VERSION}: not a vLLM release number (e.g. 0.34.0, 0.35.0rc1)"

cd "${ROOT}"
[[ -x "${AGAINST}" ]] ||
    bad "--against ${AGAINST}: no Python interpreter there (the pinned release's venv: scripts/install-vllm.sh)"
[[ -x .vllm-venv/bin/python ]] ||
    bad ".vllm-venv/bin/python: no pinned venv to take torch from (run scripts/install-vllm.sh first)"
command -v python3 >/dev/null || bad "python3 not found (it writes the page)"
VENV="${VENV:-.vllm-venvs/${VERSION}}"
PYTHON="${VENV}/bin/python"
OUT="${OUT:-target/new-vllm-release/${VERSION}}"
mkdir -p "${OUT}" "${STORE}" || bad "cannot create ${OUT} or ${STORE}"
if [[ ! -x "${KVGEOM}" ]]; then
    note "building kvgeom (${KVGEOM} is not there)"
    cargo build --quiet || bad "cargo build failed; build kvgeom or name it with --kvgeom PATH"
    [[ -x "${KVGEOM}" ]] || bad "--kvgeom ${KVGEOM}: no such program after cargo build"
fi

TIMES="${OUT}/times.txt"
: >"${TIMES}"
# A page is written from this run's outputs only.
rm -f "${OUT}"/{check.txt,sample.json,sample.txt,sample.err,matrix.json,matrix.txt,matrix.err}
# Runs "$@" as stage $1, its time appended to times.txt; returns its status.
stage() {
    local name="$1"
    shift
    local t0 status=0
    t0=$(date +%s)
    note "${name}: $*"
    "$@" || status=$?
    echo "${name} $(($(date +%s) - t0)) ${status}" >>"${TIMES}"
    note "${name}: exit ${status} in $(($(date +%s) - t0)) s"
    return "${status}"
}

status=0
# The pinned venv by its physical path: the install's stamp names it, and a
# venv reached through a link must find the stamp its install wrote.
PINNED_VENV="$(cd .vllm-venv && pwd -P)"
stage install scripts/install-vllm.sh --version "${VERSION}" --venv "${VENV}" --torch-from "${PINNED_VENV}" ||
    status=$?
if ((status != 0)); then
    bad "vLLM ${VERSION} did not install (scripts/install-vllm.sh exit ${status}, its reason above)"
fi

shape_check() {
    local python="${PYTHON}"
    [[ "${python}" == /* ]] || python="${ROOT}/${python}"
    (cd vllm-driver && "${python}" -B -c '
import sys
import api_check, fake_nixl
modes = ("pull", "push")
lacking = (api_check.missing(modes, fake_nixl.FakeNixlWrapper)
           + api_check.missing_for_scheduler(modes, "place")
           + api_check.missing_for_scheduler(modes, "run"))
for item in lacking:
    print(f"  {item}")
for item in api_check.optional():
    print(f"  absent, done without: {item}")
sys.exit(2 if lacking else 0)
') >"${OUT}/check.txt" 2>&1
}
status=0
stage check shape_check || status=$?
if ((status != 0)); then
    cat "${OUT}/check.txt" >&2
    bad "vLLM ${VERSION}: the driver's shape check refuses it (each piece above; vllm-driver/api_check.py)"
fi

failed=""
status=0
stage sample "${KVGEOM}" sweep --connector vllm --vllm-python "${PYTHON}" --prompts "${SAMPLE_PROMPTS}" \
    --format json --out "${OUT}/sample.json" "${SAMPLE_GEOMETRIES[@]}" >"${OUT}/sample.txt" 2>"${OUT}/sample.err" ||
    status=$?
((status == 2)) && failed+=" sample"

status=0
((SKIP_MATRIX)) || stage matrix "${KVGEOM}" matrix --vllm-python "${AGAINST}" --vllm-python "${PYTHON}" \
    --out "${OUT}/matrix.json" --out-dir "${STORE}" >"${OUT}/matrix.txt" 2>"${OUT}/matrix.err" ||
    status=$?
((status == 2)) && failed+=" matrix"

stage page python3 scripts/new-vllm-release-page.py --version "${VERSION}" \
    --against "${AGAINST}" --python "${PYTHON}" --out "${OUT}" ||
    bad "the page could not be written (the stages' outputs are in ${OUT})"

note "draft page: ${OUT}/vllm-${VERSION}.md"
if [[ -n "${failed}" ]]; then
    bad "the driver could not run vLLM ${VERSION} in:${failed} (exit 2; see ${OUT}/*.err)"
fi
