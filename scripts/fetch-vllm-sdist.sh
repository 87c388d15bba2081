#!/usr/bin/env bash
# Fetches vLLM 0.34.0's sdist once and turns it into a git tree with the
# patches of tests/fixtures/vllm-branch/ as an uncommitted change: a stand-in
# for a connector developer's branch, for tests/live/vllm_branch.rs.
#
# Usage: scripts/fetch-vllm-sdist.sh [--dir DIR]
#
# DIR (default target/vllm-src/) gets vllm-0.34.0.tar.gz (checked against
# PyPI's sha256) and vllm-0.34.0/, a git repository whose one commit is the
# pristine sdist (fixed author and date, so its commit id is the same on
# every machine; tagged v0.34.0) and whose work tree carries the patches, uncommitted. A
# rerun keeps the download and the commit, puts the work tree back to the
# commit and applies the patches again (a few seconds). Prints the tree's
# path. Then:
#
#   scripts/install-vllm.sh --source target/vllm-src/vllm-0.34.0 \
#       --venv target/vllm-src/venv --torch-from .vllm-venv
#
# Exit 2 with the reason: a download that fails or does not match, a patch
# that does not apply.
set -euo pipefail

VERSION="0.34.0"
SHA256="fcad848b246a9d8652b47e6425af92334dc02492f9802720f54e27b823cf0113"
URL="https://files.pythonhosted.org/packages/92/21/6e0b077dc4a0b28f5a8ce8bb352a38d7196650d681fd4faa87f8dc622eff/vllm-${VERSION}.tar.gz"

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PATCHES=("${ROOT}"/tests/fixtures/vllm-branch/*.patch)
DIR="${ROOT}/target/vllm-src"
START=$(date +%s)

bad() {
    echo "fetch-vllm-sdist: error: $*" >&2
    exit 2
}
note() { echo "fetch-vllm-sdist: $*" >&2; }

while (($#)); do
    case "$1" in
    --dir)
        [[ $# -ge 2 ]] || bad "--dir needs a folder"
        DIR="$2"
        shift 2
        ;;
    -h | --help)
        sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'
        exit 0
        ;;
    *) bad "unknown argument $1 (usage: scripts/fetch-vllm-sdist.sh [--dir DIR])" ;;
    esac
done
mkdir -p "${DIR}" || bad "cannot create ${DIR}"
DIR="$(cd "${DIR}" && pwd)"
TARBALL="${DIR}/vllm-${VERSION}.tar.gz"
TREE="${DIR}/vllm-${VERSION}"

if [[ ! -f "${TARBALL}" ]] || ! echo "${SHA256}  ${TARBALL}" | sha256sum -c --status; then
    note "downloading vllm-${VERSION}.tar.gz (49 MB) from PyPI"
    curl -sSLf --retry 3 -o "${TARBALL}.part" "${URL}" || bad "could not download ${URL}"
    echo "${SHA256}  ${TARBALL}.part" | sha256sum -c --status ||
        bad "${URL} does not have PyPI's sha256 ${SHA256}"
    mv "${TARBALL}.part" "${TARBALL}"
fi

git_tree() {
    git -C "${TREE}" -c core.autocrlf=false "$@"
}

if ! git_tree rev-parse --verify -q HEAD >/dev/null 2>&1; then
    note "unpacking and committing the pristine sdist"
    rm -rf "${TREE}" "${TREE}.part"
    mkdir -p "${TREE}.part"
    tar --no-same-owner -xzf "${TARBALL}" -C "${TREE}.part" --strip-components=1 || bad "cannot unpack ${TARBALL}"
    mv "${TREE}.part" "${TREE}"
    git_tree init -q
    git_tree add -A -f .
    GIT_AUTHOR_NAME=kvgeom GIT_AUTHOR_EMAIL=kvgeom@localhost GIT_AUTHOR_DATE="2026-11-01T00:00:00Z" \
        GIT_COMMITTER_NAME=kvgeom GIT_COMMITTER_EMAIL=kvgeom@localhost GIT_COMMITTER_DATE="2026-11-01T00:00:00Z" \
        git_tree commit -q --no-gpg-sign -m "vLLM ${VERSION} sdist"
fi

# The release tag: setuptools-scm makes the built wheel's version from it
# (0.34.0+d<date>.empty for the patched tree), as on a clone of vLLM.
git_tree tag -f "v${VERSION}" HEAD >/dev/null

# Back to the commit (build outputs of an install go too), then the patches.
git_tree reset -q --hard
git_tree clean -q -fdx
for patch in "${PATCHES[@]}"; do
    [[ -f "${patch}" ]] || bad "no patch under ${ROOT}/tests/fixtures/vllm-branch/"
    git_tree apply "${patch}" 2>/dev/null || bad "${patch} does not apply to the vLLM ${VERSION} sdist"
done
note "${TREE}: commit $(git_tree rev-parse --short HEAD), $(git_tree status --porcelain | wc -l) files changed by ${#PATCHES[@]} patches ($(($(date +%s) - START)) s)"
echo "${TREE}"
