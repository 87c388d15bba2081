#!/usr/bin/env bash
# Runs the whole budgeted GPU check (scripts/gpu-check.sh run) on the
# stand-in CUDA driver and checks what a user gets back: it ends inside its
# budget; the results folder holds summary.txt, figures.json and
# logs.tar.gz and nothing else (at most 8 files of at most 16 MiB); the
# summary lists every step with a status, and every cut, skipped or unrun
# step says why; figures.json agrees with it; the archive holds the log of
# every step that ran; nothing was written outside the results folder; and
# on the stand-in the machine check fails for the missing libnvidia-ml,
# the device checks pass, and real NIXL on its "VRAM" is refused (so the
# steps that need it are skipped, saying so).
#
# Usage: scripts/check-gpu-check.sh [--pack DIR] [--budget SECONDS|default]
#   --pack DIR   a pack from `scripts/gpu-check.sh pack` (default: build one
#                with --debug into target/gpu-check-pack)
#   --budget     the run's budget (default: the script's own default)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TARGET="${CARGO_TARGET_DIR:-${ROOT}/target}"
pack="" budget=default

while (($#)); do
    case "$1" in
    --pack)
        pack="$2"
        shift
        ;;
    --budget)
        budget="$2"
        shift
        ;;
    *)
        echo "usage: $0 [--pack DIR] [--budget SECONDS|default]" >&2
        exit 2
        ;;
    esac
    shift
done

fail() {
    echo "check-gpu-check: FAILED: $*" >&2
    exit 1
}

mock="$("${ROOT}/scripts/mock-cuda-check.sh" --build)"
if [[ -z "${pack}" ]]; then
    pack="$("${ROOT}/scripts/gpu-check.sh" pack --debug "${TARGET}/gpu-check-pack" | tail -n1)"
fi
pack="$(cd "${pack}" && pwd)"
[[ -x "${pack}/gpu-check.sh" ]] || fail "no gpu-check.sh in ${pack}"

# The run's steps and default budget, from the packed script itself.
mapfile -t steps < <(bash -c 'eval "$(sed -n "/^STEPS=(/,/)/p" "$1")"; printf "%s\n" "${STEPS[@]}"' _ "${pack}/gpu-check.sh")
((${#steps[@]} >= 8)) || fail "could not read the step list from ${pack}/gpu-check.sh"
default_budget="$(sed -n 's/^DEFAULT_BUDGET=\([0-9]*\)$/\1/p' "${pack}/gpu-check.sh")"
args=()
if [[ "${budget}" == default ]]; then
    budget="${default_budget}"
else
    args+=(--budget "${budget}")
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/check-gpu-check.XXXXXX")"
trap 'rm -rf "${work}"' EXIT
results="${work}/results" scratch="${work}/cwd" tmp="${work}/tmp"
mkdir -p "${scratch}" "${tmp}"
touch "${work}/before"
sleep 1

echo "check-gpu-check: running the check on the stand-in driver, budget ${budget} s"
start="$(date +%s%N)"
status=0
(
    cd "${scratch}"
    export TMPDIR="${tmp}"
    export LD_LIBRARY_PATH="${mock}${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}"
    # The small KimiLinear-scale geometry: the benchmark's own request needs
    # about 6.5 GB, more than a shared CI machine should give a stand-in.
    "${pack}/gpu-check.sh" run "${args[@]}" --results "${results}" \
        --bench-geometry geometries/g6-kimi-linear-scale.toml --bench-prompt 6529 \
        >"${work}/stdout" 2>"${work}/stderr"
) || status=$?
elapsed_ms=$((($(date +%s%N) - start) / 1000000))
cat "${work}/stdout"
echo "check-gpu-check: gpu-check.sh run exited ${status} after $((elapsed_ms / 1000)).$((elapsed_ms % 1000 / 100)) s"

# It ends inside its budget, with a verdict (not a usage error or a kill).
((elapsed_ms <= budget * 1000)) || fail "the check took ${elapsed_ms} ms, over its ${budget} s budget"
((status == 0 || status == 1)) || fail "exit status ${status} (expected 0 or 1)"

# The results folder: the three files, nothing else, each within limits.
mapfile -t files < <(cd "${results}" && find . -mindepth 1 -printf '%P\n' | sort)
[[ "${files[*]}" == "figures.json logs.tar.gz summary.txt" ]] ||
    fail "the results folder holds: ${files[*]} (expected figures.json logs.tar.gz summary.txt)"
for f in "${files[@]}"; do
    (($(stat -c %s "${results}/${f}") <= 16 * 1024 * 1024)) || fail "${f} is over 16 MiB"
done

# The summary: every step once, with a status; cut, skipped and unrun steps say why.
summary="${results}/summary.txt"
grep -q '^RESULT: ' "${summary}" || fail "the summary has no RESULT line"
cmp -s "${summary}" <(sed -n '/^== kvgeom GPU check/,$p' "${work}/stdout") ||
    fail "summary.txt differs from the summary printed at the end"
declare -A status_of=()
for s in "${steps[@]}"; do
    line="$(grep -E "^${s} +" "${summary}" | head -n1 || true)"
    [[ -n "${line}" ]] || fail "the summary has no line for step ${s}"
    [[ "$(grep -cE "^${s} +(ok|FAILED|CUT|SKIPPED|NOT RUN) " "${summary}")" == 1 ]] ||
        fail "step ${s} is not listed exactly once with a status: ${line}"
    st="$(sed -E "s/^${s} +(ok|FAILED|CUT|SKIPPED|NOT RUN) .*/\1/" <<<"${line}")"
    status_of[${s}]="${st}"
    case "${st}" in
    CUT) grep -qE 'cut at [0-9.]+ s by the budget|timed out after its own limit' <<<"${line}" ||
        fail "a cut step does not say so: ${line}" ;;
    SKIPPED) grep -q 'skipped: ' <<<"${line}" || fail "a skipped step does not say why: ${line}" ;;
    "NOT RUN") grep -q 'no time left' <<<"${line}" || fail "an unrun step does not say why: ${line}" ;;
    FAILED) [[ "$(awk '{ $1 = $2 = $3 = $4 = ""; print }' <<<"${line}" | tr -d ' ')" != "" ]] ||
        fail "a failed step gives no reason: ${line}" ;;
    esac
done

# figures.json: valid, the same steps and statuses.
python3 - "${results}/figures.json" "${steps[@]}" <<'PY' || fail "figures.json does not match the summary"
import json, sys
figures = json.load(open(sys.argv[1]))
names = [s["name"] for s in figures["steps"]]
assert names == sys.argv[2:], names
assert all(s["status"] in ("ok", "FAILED", "CUT", "SKIPPED", "NOT RUN") for s in figures["steps"])
assert figures["result"].startswith("RESULT: ")
for b in figures["bench"]:
    assert b["path"] and b["op"] in ("READ", "WRITE"), b
PY
for s in "${steps[@]}"; do
    grep -q "\"name\": \"${s}\", \"status\": \"${status_of[${s}]}\"" "${results}/figures.json" ||
        fail "figures.json gives step ${s} another status than the summary (${status_of[${s}]})"
done

# The archive: the log of every step that ran; nothing outside the folder.
mapfile -t logs < <(tar -tzf "${results}/logs.tar.gz")
for s in "${steps[@]}"; do
    case "${status_of[${s}]}" in
    ok | FAILED | CUT)
        printf '%s\n' "${logs[@]}" | grep -qE "^logs/${s}(-[0-9]+)?\.log$" ||
            fail "logs.tar.gz has no log of step ${s}"
        ;;
    esac
done
if [[ "${status_of[nixl-canary]}" != "SKIPPED" && "${status_of[nixl-canary]}" != "NOT RUN" ]]; then
    printf '%s\n' "${logs[@]}" | grep -qE '^logs/ucx-nixl-canary-0\.[0-9]+\.log' ||
        fail "logs.tar.gz has no UCX log of the NIXL canary"
fi
stray="$(find "${pack}" "${scratch}" "${tmp}" -newer "${work}/before" -type f \
    ! -path "${pack}/.nixl-runtime/*" -print)"
[[ -z "${stray}" ]] || fail "files written outside the results folder: ${stray}"

# What the stand-in must give: no libnvidia-ml (machine fails, naming it),
# working device code paths, real NIXL refused on its "VRAM".
grep -E '^machine +FAILED .*libnvidia-ml\.so\.1' "${summary}" | grep -q 'stand-in' ||
    fail "the machine step does not name the stand-in driver and the missing libnvidia-ml.so.1"
[[ "${status_of[device]}" == ok ]] || fail "the device checks did not pass on the stand-in"
case "${status_of[nixl-canary]}" in
FAILED)
    for s in bench-peer-write bench-peer-read nixl-sweep; do
        [[ "${status_of[${s}]}" == SKIPPED ]] || fail "step ${s} ran although the canary failed"
    done
    ;;
ok) fail "real NIXL accepted the stand-in's host memory as VRAM" ;;
esac
if ((budget >= default_budget)); then
    grep -qE '^vram-loopback-sweep +ok .*same as host' "${summary}" ||
        fail "with the default budget the VRAM loopback sweep must finish and equal the host sweep"
fi
echo "check-gpu-check: the ${budget} s check ended in $((elapsed_ms / 1000)) s with a complete summary, every log in ${results##*/}/logs.tar.gz"
