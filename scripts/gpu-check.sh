#!/usr/bin/env bash
# The GPU device check of kvgeom, in two halves:
#
#   scripts/gpu-check.sh pack [--debug] [DIR]
#       On a build machine (x86-64 Linux, cargo, libclang; network only if the
#       NIXL runtime is not installed yet): builds kvgeom with
#       `--features nixl,cuda` and the GPU test binary (tests/gpu.rs), release
#       (`--debug`: the dev profile, for CI), and packs them with the trimmed
#       NIXL runtime (tar.xz), the geometries and this script into DIR
#       (default: gpu-check/ at the project root), under 64 MiB.
#
#   DIR/gpu-check.sh run [--budget SECONDS] [--results FOLDER] [--host-memory]
#                        [--bench-geometry FILE] [--bench-prompt N] [--extras] [DIR]
#       On any machine with an NVIDIA driver and the CUDA 13 runtime (no
#       network needed): every step in the order of what it proves, all of it
#       inside one budget (default 420 s, so that it fits one 8-minute
#       command): machine facts; device buffers, post-process and loopback on
#       VRAM; the VRAM loopback sweep against the host; a 4-case real-NIXL
#       VRAM canary (retried with UCX_MEMTYPE_CACHE=n, then UCX's defaults);
#       the in-process benchmark; the two-process benchmark, WRITE then READ;
#       a real-NIXL VRAM sweep sized to the time left; the rest of the GPU
#       tests. Each step runs under `timeout -k` with the smaller of its own
#       limit and its share of the time left; a step that fails or is skipped
#       stops only the steps that need it. A summary line is written as each
#       step ends, the whole summary on any exit. FOLDER (default DIR/results)
#       gets summary.txt, figures.json and logs.tar.gz (every log, UCX's
#       included; each file capped) and nothing else.
#       `--host-memory` runs the same steps on host memory (to try the pack on
#       a machine without a GPU). `--bench-geometry` and `--bench-prompt` pick
#       the benchmark request (default bench/kimi-linear-vram.toml, 16384
#       tokens: 571 MB moved, about 6.5 GB of device memory). `--extras` adds
#       the benchmark with vLLM's agent settings and with GET zero-copy forced.
#       Exit status: 0 when every step that ran passed, 1 otherwise, 2 on bad
#       arguments.
#
# Environment: CUDA_HOME (where to look for libcudart.so.13 first). The
# inherited UCX_*, CUDA_* and library-path settings are recorded; UCX_TLS and
# UCX_NET_DEVICES are set for the run (VRAM: tcp,sm,self,cuda_copy,cuda_ipc).
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PACK_LIMIT_BYTES=$((64 * 1024 * 1024))
DEFAULT_BUDGET=420
# Kept back from the budget: the grace a timed-out step's processes get
# between SIGTERM and SIGKILL, then writing and packing the results.
KILL_GRACE_S=3
PACK_RESERVE_MS=10000
# A step is not started with less than this, and gets at least the floor
# while the budget lasts.
MIN_STEP_MS=2000
STEP_FLOOR_MS=6000
# Each log is capped to this many bytes in logs.tar.gz (head and tail).
LOG_CAP_BYTES=$((2 * 1024 * 1024))
RESULT_FILE_LIMIT=$((16 * 1024 * 1024))
VRAM_TLS="tcp,sm,self,cuda_copy,cuda_ipc"
HOST_TLS="tcp,sm,self"

die() {
    echo "gpu-check: error: $*" >&2
    exit 2
}

note() {
    echo "gpu-check: $*" >&2
}

usage() {
    sed -n '2,40p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
    exit 2
}

# ---------------------------------------------------------------- pack

pack() {
    local root dest="" json tests_exe kvgeom_exe profile=release
    root="$(cd "${SCRIPT_DIR}/.." && pwd)"
    [[ -f "${root}/Cargo.toml" ]] || die "pack runs from a kvgeom checkout (no Cargo.toml above ${SCRIPT_DIR})"
    while (($#)); do
        case "$1" in
        --debug)
            profile=dev
            ;;
        -h | --help) usage ;;
        -*) die "pack: unknown option $1" ;;
        *) dest="$1" ;;
        esac
        shift
    done
    dest="${dest:-${root}/gpu-check}"
    command -v cargo >/dev/null || die "cargo is needed to build"
    # shellcheck source=require-libclang.sh
    source "${SCRIPT_DIR}/require-libclang.sh"
    require_libclang "gpu-check"
    command -v xz >/dev/null || die "xz is needed to pack the NIXL runtime"
    cd "${root}"

    # One cargo invocation builds both: cargo builds the binary for the
    # integration test, with the test build's dependency features, so the
    # library is compiled once (a separate `cargo build` resolves features
    # without the dev-dependencies and compiles it again).
    note "building kvgeom and the GPU test binary (${profile}, --features nixl,cuda)"
    json="$(cargo test --profile "${profile}" --features nixl,cuda --test gpu --no-run --message-format=json)"
    tests_exe="$(printf '%s\n' "${json}" | grep '"name":"gpu"' | grep -o '"executable":"[^"]*"' |
        tail -n1 | sed 's/^"executable":"//; s/"$//')"
    [[ -n "${tests_exe}" && -x "${tests_exe}" ]] || die "cargo did not report the gpu test executable"
    kvgeom_exe="$(printf '%s\n' "${json}" | grep '"kind":\["bin"\]' | grep '"name":"kvgeom"' |
        grep -o '"executable":"[^"]*"' | tail -n1 | sed 's/^"executable":"//; s/"$//')"
    [[ -n "${kvgeom_exe}" && -x "${kvgeom_exe}" ]] || die "cargo did not report the kvgeom executable"

    if [[ ! -f "${root}/.nixl-runtime/.installed" ]]; then
        note "installing the NIXL runtime first"
        "${root}/scripts/install-nixl-runtime.sh" >&2
    fi

    rm -rf "${dest}"
    mkdir -p "${dest}/bin"
    cp "${kvgeom_exe}" "${dest}/bin/kvgeom"
    cp "${tests_exe}" "${dest}/bin/gpu-tests"
    if command -v strip >/dev/null; then
        strip "${dest}/bin/kvgeom" "${dest}/bin/gpu-tests"
    fi
    cp -r "${root}/geometries" "${root}/bench" "${dest}/"
    cp "${root}/scripts/gpu-check.sh" "${dest}/gpu-check.sh"
    note "packing the NIXL runtime (tar.xz)"
    tar -C "${root}" --exclude=.nixl-runtime/env.sh --exclude=.nixl-runtime/env-gpu.sh \
        -cJf "${dest}/nixl-runtime.tar.xz" .nixl-runtime
    {
        echo "kvgeom device check pack"
        echo "commit: $(git -C "${root}" rev-parse HEAD 2>/dev/null || echo unknown)"
        echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -srm), profile ${profile}"
        echo "rustc: $(rustc --version 2>/dev/null || echo unknown)"
        echo "nixl runtime: $(cat "${root}/.nixl-runtime/.installed")"
    } >"${dest}/MANIFEST"

    local size
    size="$(du -sb "${dest}" | cut -f1)"
    if ((size >= PACK_LIMIT_BYTES)); then
        die "the pack is $((size / 1024 / 1024)) MiB, over the 64 MiB limit"
    fi
    note "packed $((size / 1024 / 1024)) MiB into ${dest}"
    echo "${dest}"
}

# ---------------------------------------------------------------- run: helpers

now_ms() {
    local t="${EPOCHREALTIME//[.,]/}"
    echo $((t / 1000))
}

# Seconds with one decimal from milliseconds.
secs() {
    printf '%d.%d' $(($1 / 1000)) $((($1 % 1000) / 100))
}

# The folder holding libcudart.so.13, or nothing.
find_cudart() {
    local d
    for d in ${CUDA_HOME:+"${CUDA_HOME}/targets/x86_64-linux/lib" "${CUDA_HOME}/lib64" "${CUDA_HOME}/lib"} \
        /usr/local/cuda-13*/targets/x86_64-linux/lib /usr/local/cuda-13*/lib64 \
        /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda/lib64 \
        /usr/lib/x86_64-linux-gnu /usr/lib64; do
        if [[ -e "${d}/libcudart.so.13" ]]; then
            echo "${d}"
            return
        fi
    done
}

# The file the dynamic loader finds for library NAME: LD_LIBRARY_PATH first,
# then the loader cache; nothing when none.
resolve_lib() {
    local name="$1" d found
    local IFS=:
    for d in ${LD_LIBRARY_PATH:-}; do
        if [[ -n "${d}" && -e "${d}/${name}" ]]; then
            readlink -f "${d}/${name}"
            return
        fi
    done
    found="$(ldconfig -p 2>/dev/null | awk -v n="${name}" '$1 == n { print $NF; exit }')"
    if [[ -n "${found}" ]]; then
        readlink -f "${found}"
    fi
}

# A JSON number, or the text as a string when it is not one ("inf").
json_num() {
    if [[ "$1" =~ ^-?[0-9]+(\.[0-9]+)?$ ]]; then
        printf '%s' "$1"
    else
        json_str "$1"
    fi
}

json_str() {
    local s="$1"
    s="${s//\\/\\\\}"
    s="${s//\"/\\\"}"
    s="$(printf '%s' "${s}" | tr -d '\000-\010\013-\037' | tr '\t\n\r' '   ')"
    printf '"%s"' "${s}"
}

# ---------------------------------------------------------------- run: steps

# The planned steps, in order: name, own limit (s), weight in the share of
# the time left, what it proves.
STEPS=(machine device vram-loopback-sweep nixl-canary bench-in-process
    bench-peer-write bench-peer-read nixl-sweep gpu-tests-rest extra-vllm-agents extra-get-zcopy)
declare -A LIMIT=([machine]=30 [device]=60 [vram-loopback-sweep]=150 [nixl-canary]=90
    [bench-in-process]=120 [bench-peer-write]=90 [bench-peer-read]=90 [nixl-sweep]=150
    [gpu-tests-rest]=600 [extra-vllm-agents]=90 [extra-get-zcopy]=90)
# With --extras the last two share the time left with the GPU tests;
# without, they are skipped and take nothing.
declare -A WEIGHT=([machine]=30 [device]=60 [vram-loopback-sweep]=150 [nixl-canary]=90
    [bench-in-process]=120 [bench-peer-write]=90 [bench-peer-read]=90 [nixl-sweep]=150
    [gpu-tests-rest]=90 [extra-vllm-agents]=45 [extra-get-zcopy]=45)
declare -A ABOUT=(
    [machine]="GPU, driver, inherited UCX/CUDA settings, libraries UCX's CUDA modules load"
    [device]="device buffers, post-process and loopback on device memory (GPU tests)"
    [vram-loopback-sweep]="every default case on device memory over loopback, against the host"
    [nixl-canary]="4 real-NIXL cases on device memory, against the host"
    [bench-in-process]="benchmark in one process: copy, copy per pair, loopback, NIXL"
    [bench-peer-write]="benchmark, prefill in a peer process: WRITE (ucp_put)"
    [bench-peer-read]="benchmark, prefill in a peer process: READ (ucp_get)"
    [nixl-sweep]="a seeded random subset of the real-NIXL sweep on device memory, sized to fit"
    [gpu-tests-rest]="the remaining GPU tests (benchmark bytes, sweeps against the host)"
    [extra-vllm-agents]="in-process NIXL benchmark with vLLM's agent settings (--extras)"
    [extra-get-zcopy]="peer READ with UCX_CUDA_IPC_ENABLE_GET_ZCOPY=on (--extras)")
declare -A STATUS=() DETAIL=() TOOK=() ALLOT=()
RESULT_WRITTEN=0
CHILD=""
CURRENT=""
SIGNALLED=""

# record NAME STATUS DETAIL [MS]: one step's outcome, written out at once.
record() {
    CURRENT=""
    STATUS[$1]="$2"
    DETAIL[$1]="$3"
    TOOK[$1]="${4:-0}"
    local line
    line="$(summary_line "$1")"
    echo "${line}" >>"${RESULTS}/summary.txt"
    echo "${line}" >&2
    pack_logs
}

summary_line() {
    local took="-"
    if [[ -n "${TOOK[$1]:-}" && "${TOOK[$1]}" != 0 ]]; then
        took="$(secs "${TOOK[$1]}") s"
    fi
    printf '%-20s %-8s %8s  %s' "$1" "${STATUS[$1]:-NOT RUN}" "${took}" "${DETAIL[$1]:-not reached}"
}

left_ms() {
    echo $((DEADLINE_MS - $(now_ms)))
}

# Whether step NAME can still run: not decided yet, and neither asked off
# (--extras) nor waiting for a step that already failed.
applicable() {
    [[ -z "${STATUS[$1]:-}" ]] || return 1
    case "$1" in
    extra-*) ((EXTRAS)) || return 1 ;;
    esac
    case "$1" in
    machine | device) ;;
    *) [[ "${MEMORY}" == host || -z "${STATUS[device]:-}" ]] || ((DEVICE_OK)) || return 1 ;;
    esac
    case "$1" in
    bench-peer-* | nixl-sweep | extra-*) [[ -z "${STATUS[nixl-canary]:-}" ]] || ((NIXL_OK)) || return 1 ;;
    esac
    return 0
}

# The time step NAME may take: its own limit, or its share of the time left
# by weight among the steps that can still run if that is smaller, but at
# least STEP_FLOOR_MS while the time lasts; the last step gets all that is
# left.
allot_ms() {
    local name="$1" s sum=0 after=0 left own share
    left="$(left_ms)"
    for s in "${STEPS[@]}"; do
        if [[ "${s}" == "${name}" ]]; then
            after=1
        fi
        if ((after)) && applicable "${s}"; then
            sum=$((sum + WEIGHT[$s]))
        fi
    done
    own=$((LIMIT[$name] * 1000))
    if ((sum <= WEIGHT[$name])); then
        share="${left}"
    else
        share=$((left * WEIGHT[$name] / sum))
        ((share >= STEP_FLOOR_MS)) || share=$((left < STEP_FLOOR_MS ? left : STEP_FLOOR_MS))
    fi
    ((share < own)) && own="${share}"
    echo "${own}"
}

# exec_step NAME MS LOG COMMAND...: run COMMAND under `timeout -k` for MS
# milliseconds, stdout and stderr to LOG; sets STEP_RC and STEP_MS.
exec_step() {
    local name="$1" ms="$2" log="$3" start
    shift 3
    local limit_s
    limit_s="$(secs "${ms}")"
    start="$(now_ms)"
    {
        echo "# step ${name}: $*"
        echo "# limit ${limit_s} s; started $(date -u +%H:%M:%S)"
    } >>"${log}"
    note "${name}: $* (limit ${limit_s} s, log ${log#"${RESULTS}/"})"
    set +e
    timeout -k "${KILL_GRACE_S}" "${limit_s}" "$@" </dev/null >>"${log}" 2>&1 &
    CHILD=$!
    wait "${CHILD}"
    STEP_RC=$?
    CHILD=""
    set -e
    STEP_MS=$(($(now_ms) - start))
    echo "# exit ${STEP_RC} after $(secs "${STEP_MS}") s" >>"${log}"
    if [[ -n "${SIGNALLED}" ]]; then
        exit 1
    fi
}

# How a step that timed out reads: cut by the budget or over its own limit.
timed_out() {
    local name="$1" ms="$2" log="$3"
    if ((ms < LIMIT[$name] * 1000)); then
        echo "cut at $(secs "${ms}") s by the budget (own limit ${LIMIT[$name]} s); partial log in logs/${log##*/}"
    else
        echo "timed out after its own limit of ${LIMIT[$name]} s; see logs/${log##*/}"
    fi
}

# begin NAME: sets MS to the time allotted; false (and NAME recorded NOT
# RUN) when that is too little to start.
begin() {
    MS="$(allot_ms "$1")"
    ALLOT[$1]="${MS}"
    CURRENT="$1"
    if ((MS < MIN_STEP_MS)); then
        record "$1" "NOT RUN" "no time left ($(secs "$(left_ms)") s of the budget left)"
        return 1
    fi
}

skip() {
    record "$1" "SKIPPED" "$2"
}

# The first line of LOG that says what went wrong.
first_error() {
    local line
    line="$(grep -m1 -E 'FAILED|^error|[Ee]rror:|hung|differ|cases failed|panicked|not found' "$1" 2>/dev/null || true)"
    if [[ -z "${line}" ]]; then
        line="$(grep -v '^#' "$1" 2>/dev/null | tail -n1 || true)"
    fi
    echo "${line:0:200}"
}

# "N cases, N passed, N failed" from a sweep's JSON report.
counts() {
    local key parts=()
    for key in cases passed failed; do
        parts+=("$(grep -m1 -o "\"${key}\": [0-9]*" "$1" 2>/dev/null | grep -o '[0-9]*$' || echo '?') ${key}")
    done
    echo "${parts[0]}, ${parts[1]}, ${parts[2]}"
}

# ucx_env STEP: the environment that gives a step's processes their own UCX
# log files (info level, module loading included, size-capped).
ucx_env() {
    printf '%s\n' "UCX_LOG_LEVEL=info" "UCX_MODULE_LOG_LEVEL=info" \
        "UCX_LOG_FILE=${LOGS}/ucx-$1.%p.log" "UCX_LOG_FILE_SIZE=4194304" "UCX_LOG_FILE_ROTATE=1"
}

# A sweep: STEP PART LIMIT_MS ENV... -- ARGS... (log and JSON report
# named PART); sets SWEEP_DETAIL; 0 passed, 124 cut or timed out, 1 failed.
run_sweep() {
    local name="$1" ms="$3" report="${LOGS}/$2.json" log="${LOGS}/$2.log"
    shift 3
    local envs=()
    while [[ "$1" != "--" ]]; do
        envs+=("$1")
        shift
    done
    shift
    exec_step "${name}" "${ms}" "${log}" env "${envs[@]}" "${KVGEOM}" sweep --no-shrink \
        --format json --out "${report}" "$@"
    if ((STEP_RC == 0)); then
        SWEEP_DETAIL="$(counts "${report}")$(grep -q 'give the same results' "${log}" && echo '; same as host')"
        return 0
    elif ((STEP_RC == 124 || STEP_RC == 137)); then
        SWEEP_DETAIL="$(timed_out "${name}" "${ms}" "${log}")"
        return 124
    fi
    SWEEP_DETAIL="exit ${STEP_RC}: $(first_error "${log}")"
    return 1
}

# ---------------------------------------------------------------- run: the steps

step_machine() {
    local log="${LOGS}/machine.log" problems=() notes=()
    begin machine || return 0
    local start
    start="$(now_ms)"
    {
        echo "== machine facts, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
        echo "pack: $(tr '\n' ';' <"${DIR}/MANIFEST" 2>/dev/null || echo 'no MANIFEST')"
        echo "host: $(uname -srm); $(nproc 2>/dev/null || echo '?') CPUs"
        echo
        echo "== inherited environment (before this script changed anything)"
        printf '%s\n' "${INHERITED_ENV}"
        echo
        echo "== environment for the run"
        env | grep -E '^(UCX_|NIXL_|KVGEOM_|LD_LIBRARY_PATH=)' | sort
        echo
        echo "== nvidia-smi"
    } >>"${log}"
    if command -v nvidia-smi >/dev/null; then
        timeout -k 2 20 nvidia-smi >>"${log}" 2>&1 || echo "nvidia-smi failed" >>"${log}"
        GPU_LINE="$(timeout -k 2 20 nvidia-smi --query-gpu=name,driver_version,memory.total \
            --format=csv,noheader 2>/dev/null | head -n1 || true)"
    else
        echo "nvidia-smi: not found" >>"${log}"
        GPU_LINE="no nvidia-smi"
    fi
    # The driver: what cudarc loads (libcuda.so first, libcuda.so.1 last)
    # against what UCX's CUDA modules link (libcuda.so.1).
    local name f first="" soname
    soname="$(resolve_lib libcuda.so.1)"
    {
        echo
        echo "== CUDA driver libraries (cudarc tries libcuda.so first, libcuda.so.1 last; UCX links libcuda.so.1)"
    } >>"${log}"
    for name in libcuda.so libcuda.so.13 libcuda.so.12 libcuda.so.1; do
        f="$(resolve_lib "${name}")"
        echo "${name} -> ${f:-not found}" >>"${log}"
        if [[ -n "${f}" && -z "${first}" ]]; then
            first="${f}"
        fi
    done
    DRIVER_LINE="${first:-none}"
    if [[ -z "${first}" ]]; then
        [[ "${MEMORY}" == vram ]] && problems+=("no libcuda (the NVIDIA driver) on the library path")
    else
        if [[ "${first}" == */stubs/* ]]; then
            problems+=("cudarc would load the stub ${first}")
        elif [[ -n "${soname}" && "${first}" != "${soname}" ]]; then
            problems+=("cudarc would load ${first}, UCX links ${soname}")
        fi
        if grep -q 'kvgeom stand-in' "${first}" 2>/dev/null; then
            DRIVER_LINE="${first} (the kvgeom stand-in driver: host memory, not a GPU)"
        fi
    fi
    echo "libcudart.so.13 -> ${CUDART:-not found}" >>"${log}"
    # Every library UCX's CUDA modules need, with the final library path.
    local mod missing
    {
        echo
        echo "== ldd of the binaries and of UCX's CUDA modules (LD_LIBRARY_PATH=${LD_LIBRARY_PATH})"
    } >>"${log}"
    for mod in "${KVGEOM}" "${DIR}/bin/gpu-tests" "${UCX_MODULES}"/libuct_cuda*.so* "${UCX_MODULES}"/libucm_cuda*.so*; do
        [[ -e "${mod}" ]] || continue
        echo "-- ${mod}" >>"${log}"
        ldd "${mod}" >>"${log}" 2>&1 || true
        missing="$(ldd "${mod}" 2>&1 | awk '/not found/ { print $1 }' | sort -u | tr '\n' ' ')"
        missing="${missing% }"
        [[ -n "${missing}" ]] || continue
        # The CUDA transports (libuct_cuda) need the driver's libcuda.so.1 and
        # libnvidia-ml.so.1; libcudart.so.13 feeds only UCX's memory hooks
        # (libucm_cuda).
        if [[ "${MEMORY}" == vram && "${mod##*/}" != libucm_cuda* && "${mod}" == "${UCX_MODULES}"/* ]]; then
            problems+=("${mod##*/} needs ${missing}")
        else
            notes+=("${mod##*/} needs ${missing}")
        fi
    done
    [[ -n "${CUDART}" ]] || notes+=("no libcudart.so.13 (UCX's CUDA memory hooks stay off; set CUDA_HOME)")
    local took=$(($(now_ms) - start))
    local detail="${GPU_LINE}; driver ${DRIVER_LINE}"
    if ((${#notes[@]})); then
        detail+="; $(printf '%s; ' "${notes[@]}")"
        detail="${detail%; }"
    fi
    if ((${#problems[@]})); then
        printf 'problem: %s\n' "${problems[@]}" >>"${log}"
        record machine "FAILED" "$(printf '%s; ' "${problems[@]}")${detail}" "${took}"
    else
        record machine "ok" "${detail}" "${took}"
    fi
}

DEVICE_TESTS=(driver_missing_is_a_typed_error device_buffers_round_trip
    post_process_on_device_matches_host loopback_moves_device_bytes)

step_device() {
    local ms log="${LOGS}/device.log"
    begin device || return 0
    ms="${MS}"
    exec_step device "${ms}" "${log}" env KVGEOM_ROOT="${DIR}" "${DIR}/bin/gpu-tests" "${DEVICE_TESTS[@]}"
    if grep -q '^test device_buffers_round_trip \.\.\. ok' "${log}"; then
        DEVICE_OK=1
    fi
    local tally
    tally="$(grep -E '^[0-9]+ passed, [0-9]+ failed, [0-9]+ skipped' "${log}" | tail -n1 || true)"
    if ((STEP_RC == 0)); then
        record device "ok" "${tally}" "${STEP_MS}"
    elif ((STEP_RC == 124 || STEP_RC == 137)); then
        record device "CUT" "$(timed_out device "${ms}" "${log}")" "${STEP_MS}"
    else
        record device "FAILED" "${tally:+${tally}; }$(first_error "${log}")" "${STEP_MS}"
    fi
}

# needs_device NAME: whether NAME can run (else it is recorded SKIPPED).
needs_device() {
    if [[ "${MEMORY}" == host ]] || ((DEVICE_OK)); then
        return 0
    fi
    skip "$1" "skipped: needs a working device (step device: ${STATUS[device]:-NOT RUN})"
    return 1
}

needs_nixl() {
    if ((NIXL_OK)); then
        return 0
    fi
    skip "$1" "skipped: needs real NIXL on ${MEMORY} memory (step nixl-canary: ${STATUS[nixl-canary]:-NOT RUN})"
    return 1
}

step_vram_loopback_sweep() {
    local ms
    needs_device vram-loopback-sweep || return 0
    begin vram-loopback-sweep || return 0
    ms="${MS}"
    local rc=0
    run_sweep vram-loopback-sweep vram-loopback-sweep "${ms}" -- \
        geometries/*.toml --memory "${MEMORY}" --transport loopback --compare-host || rc=$?
    case "${rc}" in
    0) record vram-loopback-sweep "ok" "${SWEEP_DETAIL}" "${STEP_MS}" ;;
    124) record vram-loopback-sweep "CUT" "${SWEEP_DETAIL}" "${STEP_MS}" ;;
    *) record vram-loopback-sweep "FAILED" "${SWEEP_DETAIL}" "${STEP_MS}" ;;
    esac
}

CANARY_ARGS=(geometries/g1-mla-kda-ppl3-vs-2.toml --prompts "5,29" --alloc mainline)

step_nixl_canary() {
    local ms
    needs_device nixl-canary || return 0
    begin nixl-canary || return 0
    ms="${MS}"
    # Three set-ups, each with a third of the time: the script's, with UCX's
    # memory-type cache off, with UCX's own defaults (no UCX_TLS at all).
    local labels=("UCX_TLS=${UCX_TLS}" "UCX_TLS=${UCX_TLS} UCX_MEMTYPE_CACHE=n" "UCX defaults (UCX_TLS, UCX_NET_DEVICES unset)")
    local setups=("" "UCX_MEMTYPE_CACHE=n" "-u UCX_TLS -u UCX_NET_DEVICES")
    local i rc took=0 tried=() each last_detail=""
    for i in 0 1 2; do
        # What is left of the step, shared by the attempts still to come.
        each=$(((ms - took) / (3 - i)))
        local envs=()
        read -r -a envs <<<"${setups[i]}"
        local ucx
        mapfile -t ucx < <(ucx_env "nixl-canary-${i}")
        rc=0
        run_sweep nixl-canary "nixl-canary-${i}" "${each}" \
            "${envs[@]}" "${ucx[@]}" -- "${CANARY_ARGS[@]}" --memory "${MEMORY}" \
            --transport nixl --compare-host || rc=$?
        took=$((took + STEP_MS))
        if ((rc == 0)); then
            NIXL_OK=1
            NIXL_ENV=("${envs[@]}")
            NIXL_SETUP="${labels[i]}"
            CANARY_MS_PER_CASE=$((STEP_MS / 4))
            record nixl-canary "ok" "${SWEEP_DETAIL}; with ${labels[i]}${tried:+; before: $(printf '%s; ' "${tried[@]}")}" "${took}"
            return 0
        fi
        if ((i > 0)) && [[ "${SWEEP_DETAIL}" == "${last_detail}" ]]; then
            tried+=("${labels[i]}: the same")
        else
            tried+=("${labels[i]}: ${SWEEP_DETAIL}")
        fi
        last_detail="${SWEEP_DETAIL}"
        if (($(left_ms) < MIN_STEP_MS || ms - took < MIN_STEP_MS)); then
            tried+=("no time left for the other set-ups")
            break
        fi
    done
    local detail
    detail="$(printf '%s; ' "${tried[@]}")"
    record nixl-canary "FAILED" "${detail%; }" "${took}"
}

# Benchmark tables and UCX's protocol choices, kept for the summary.
BENCH_STEPS=()

# A benchmark step: NAME NEEDS(device|nixl) ENV... -- ARGS...
run_bench() {
    local name="$1" ms log="${LOGS}/$1.log"
    shift
    local envs=()
    while [[ "$1" != "--" ]]; do
        envs+=("$1")
        shift
    done
    shift
    begin "${name}" || return 0
    ms="${MS}"
    local ucx
    mapfile -t ucx < <(ucx_env "${name}")
    exec_step "${name}" "${ms}" "${log}" env "${envs[@]}" "${ucx[@]}" UCX_PROTO_INFO=y \
        "${KVGEOM}" bench vram --memory "${MEMORY}" --geometry "${BENCH_GEOMETRY}" \
        --prompt "${BENCH_PROMPT}" "$@"
    BENCH_STEPS+=("${name}")
    local figures
    figures="$(awk '$1 ~ /^(copy|copy-per-pair|loopback|nixl|nixl-peer)$/ && NF == 6 { printf "%s %s GB/s, ", $1, $4 }' "${log}")"
    figures="${figures%, }"
    if ((STEP_RC == 0)); then
        record "${name}" "ok" "${figures:-no figures}$(grep -m1 -o 'skipped: .*' "${log}" | sed 's/^/; /' || true)" "${STEP_MS}"
    elif ((STEP_RC == 124 || STEP_RC == 137)); then
        record "${name}" "CUT" "$(timed_out "${name}" "${ms}" "${log}")" "${STEP_MS}"
    else
        record "${name}" "FAILED" "exit ${STEP_RC}: $(first_error "${log}")" "${STEP_MS}"
    fi
}

step_bench_in_process() {
    needs_device bench-in-process || return 0
    local paths="copy,copy-per-pair,loopback"
    if ((NIXL_OK)); then
        paths+=",nixl"
        run_bench bench-in-process "${NIXL_ENV[@]}" -- --paths "${paths}"
    else
        run_bench bench-in-process -- --paths "${paths}"
        if [[ "${STATUS[bench-in-process]:-}" == ok ]]; then
            DETAIL[bench-in-process]+="; nixl left out (step nixl-canary: ${STATUS[nixl-canary]:-NOT RUN})"
        fi
    fi
}

step_bench_peer() {
    local name="$1" op="$2"
    needs_device "${name}" || return 0
    needs_nixl "${name}" || return 0
    run_bench "${name}" "${NIXL_ENV[@]}" -- --peer-process --op "${op}" --paths nixl-peer
}

step_nixl_sweep() {
    local ms
    needs_device nixl-sweep || return 0
    needs_nixl nixl-sweep || return 0
    begin nixl-sweep || return 0
    ms="${MS}"
    # Two rounds. The first is sized to a third of the time at the canary's
    # pace, which counts a process start and NIXL's set-up in each of its 4
    # cases; the second (another seed) fills 60% of what is left at the pace
    # the first measured over its many cases.
    local per_case=$((CANARY_MS_PER_CASE > 50 ? CANARY_MS_PER_CASE : 50))
    local n=$((ms / 3 / per_case))
    ((n < 4)) && n=4
    local ucx rc=0 first="" took=0
    mapfile -t ucx < <(ucx_env nixl-sweep)
    run_sweep nixl-sweep nixl-sweep "${ms}" "${NIXL_ENV[@]}" "${ucx[@]}" -- \
        geometries/*.toml --random "${n}" --seed 17 --memory "${MEMORY}" --transport nixl --compare-host || rc=$?
    took="${STEP_MS}"
    if ((rc == 0)); then
        first="${SWEEP_DETAIL} (--random ${n} --seed 17, at $(secs "${per_case}") s a case)"
        per_case=$((took / n > 20 ? took / n : 20))
        local rest=$((ms - took))
        local n2=$((rest * 6 / 10 / per_case))
        if ((n2 >= 4 && rest > MIN_STEP_MS)); then
            run_sweep nixl-sweep nixl-sweep-2 "${rest}" "${NIXL_ENV[@]}" "${ucx[@]}" -- \
                geometries/*.toml --random "${n2}" --seed 18 --memory "${MEMORY}" --transport nixl --compare-host || rc=$?
            took=$((took + STEP_MS))
            SWEEP_DETAIL="${first}; then ${SWEEP_DETAIL} (--random ${n2} --seed 18, at ${per_case} ms a case)"
        else
            SWEEP_DETAIL="${first}"
        fi
    fi
    case "${rc}" in
    0) record nixl-sweep "ok" "${SWEEP_DETAIL}" "${took}" ;;
    124) record nixl-sweep "CUT" "${first:+${first}; then }${SWEEP_DETAIL}" "${took}" ;;
    *) record nixl-sweep "FAILED" "${first:+${first}; then }${SWEEP_DETAIL}" "${took}" ;;
    esac
}

step_gpu_tests_rest() {
    local ms log="${LOGS}/gpu-tests-rest.log"
    needs_device gpu-tests-rest || return 0
    begin gpu-tests-rest || return 0
    ms="${MS}"
    local skips=() t left_out=""
    for t in "${DEVICE_TESTS[@]}"; do
        skips+=(--skip "${t}")
    done
    # The real-NIXL tests need what the canary showed.
    if ((!NIXL_OK)); then
        skips+=(--skip nixl)
        left_out="; the real-NIXL tests left out (step nixl-canary: ${STATUS[nixl-canary]:-NOT RUN})"
    fi
    local ucx
    mapfile -t ucx < <(ucx_env gpu-tests-rest)
    exec_step gpu-tests-rest "${ms}" "${log}" env "${NIXL_ENV[@]}" "${ucx[@]}" KVGEOM_ROOT="${DIR}" \
        "${DIR}/bin/gpu-tests" "${skips[@]}"
    local tally done_tests
    tally="$(grep -E '^[0-9]+ passed, [0-9]+ failed, [0-9]+ skipped' "${log}" | tail -n1 || true)"
    done_tests="$(grep -cE '^test .* \.\.\. ' "${log}" || true)"
    if ((STEP_RC == 0)); then
        record gpu-tests-rest "ok" "${tally}${left_out}" "${STEP_MS}"
    elif ((STEP_RC == 124 || STEP_RC == 137)); then
        record gpu-tests-rest "CUT" "$(timed_out gpu-tests-rest "${ms}" "${log}"); ${done_tests} tests finished${left_out}" "${STEP_MS}"
    else
        record gpu-tests-rest "FAILED" "${tally:+${tally}; }$(first_error "${log}")${left_out}" "${STEP_MS}"
    fi
}

# The optional benchmark set-ups (--extras), after everything else.
# UCX_CUDA_IPC_ENABLE_SAME_PROCESS=y is never tried: UCX means it for its
# own tests, and a related same-process selection exhausted GPU memory in
# UCX 1.21 (openucx/ucx#11854).
step_extra() {
    local name="$1"
    shift
    if ((!EXTRAS)); then
        skip "${name}" "skipped: not asked for (--extras)"
        return 0
    fi
    needs_device "${name}" || return 0
    needs_nixl "${name}" || return 0
    run_bench "${name}" "${NIXL_ENV[@]}" "$@"
}

# ---------------------------------------------------------------- run: the report

# The RMA protocols UCX chose in a step's processes
# ("<operation> => <size range> | <protocol> | <transport>").
protocols() {
    local logs=("${LOGS}/ucx-$1".*.log*)
    [[ -e "${logs[0]}" ]] || return 0
    awk '
        { sub(/^\[[^]]*\] \[[^]]*\] +/, "") }
        /remote memory (read|write) by ucp_/ { hdr = $0; gsub(/^\| *| *\|$/, "", hdr); next }
        /^\+/ && !/Range/ { next }
        /^\| +[0-9]+\.\./ && hdr != "" {
            row = $0; gsub(/^\| *| *\|$/, "", row); gsub(/ +\| +/, " | ", row)
            print hdr " => " row
        }
        /by ucp_am/ { hdr = "" }
    ' "${logs[@]}" 2>/dev/null | sort -u | head -n 24
}

# UCX's lines about its CUDA modules and transports in a step's logs.
ucx_cuda_lines() {
    local logs=("${LOGS}/ucx-$1".*.log*)
    [[ -e "${logs[0]}" ]] || return 0
    # Module loading is in the summary's "UCX and CUDA" section already.
    grep -hiE 'cuda|memtype|nvlink' "${logs[@]}" 2>/dev/null | grep -v 'module\.c:' |
        sed 's/^\[[^]]*\] \[[^]]*\] *//' | cut -c1-220 | sort | uniq -c | sort -rn | head -n 8
}

write_figures() {
    local out="${RESULTS}/figures.json" s first=1 line
    {
        printf '{"budget_s": %s, "elapsed_s": %s, "memory": %s, "result": %s,\n' \
            "${BUDGET}" "$(secs $(($(now_ms) - START_MS)))" "$(json_str "${MEMORY}")" "$(json_str "${RESULT_LINE}")"
        printf ' "machine": {"gpu": %s, "driver": %s, "ucx_tls": %s, "inherited_ucx_tls": %s, "nixl_setup": %s},\n' \
            "$(json_str "${GPU_LINE}")" "$(json_str "${DRIVER_LINE}")" "$(json_str "${UCX_TLS}")" \
            "$(json_str "${INHERITED_TLS}")" "$(json_str "${NIXL_SETUP}")"
        printf ' "steps": ['
        for s in "${STEPS[@]}"; do
            ((first)) || printf ','
            first=0
            printf '\n  {"name": %s, "status": %s, "seconds": %s, "allotted_s": %s, "detail": %s, "proves": %s}' \
                "$(json_str "${s}")" "$(json_str "${STATUS[$s]:-NOT RUN}")" "$(secs "${TOOK[$s]:-0}")" \
                "$(secs "${ALLOT[$s]:-0}")" "$(json_str "${DETAIL[$s]:-not reached}")" "$(json_str "${ABOUT[$s]}")"
        done
        printf '],\n "bench": ['
        first=1
        for s in "${BENCH_STEPS[@]}"; do
            local log="${LOGS}/${s}.log" header protos=() p pfirst=1
            [[ -f "${log}" ]] || continue
            header="$(grep -m1 -E '^(READ|WRITE) of' "${log}" || true)"
            mapfile -t protos < <(protocols "${s}")
            while read -r line; do
                [[ -n "${line}" ]] || continue
                local f=()
                read -r -a f <<<"${line}"
                ((first)) || printf ','
                first=0
                printf '\n  {"step": %s, "op": %s, "path": %s, "best_s": %s, "mean_s": %s, "gb_per_s": %s, "pairs_per_s": %s, "request": %s, "ucx_protocols": [' \
                    "$(json_str "${s}")" "$(json_str "${header%% *}")" "$(json_str "${f[0]}")" \
                    "$(json_num "${f[1]}")" "$(json_num "${f[2]}")" "$(json_num "${f[3]}")" \
                    "$(json_num "${f[4]}")" "$(json_str "${header}")"
                pfirst=1
                # UCX's protocols belong to the NIXL paths only.
                if [[ "${f[0]}" == nixl* ]]; then
                    for p in "${protos[@]}"; do
                        ((pfirst)) || printf ', '
                        pfirst=0
                        json_str "${p}"
                    done
                fi
                printf ']}'
            done < <(awk '$1 ~ /^(copy|copy-per-pair|loopback|nixl|nixl-peer)$/ && NF == 6 && $2 ~ /^[0-9.]+$/' "${log}")
        done
        printf ']}\n'
    } >"${out}"
}

full_summary() {
    local s
    echo "== kvgeom GPU check: ${DIR} (budget ${BUDGET} s, $(secs $(($(now_ms) - START_MS))) s used, ${MEMORY} memory)"
    echo "gpu: ${GPU_LINE}"
    echo "driver: ${DRIVER_LINE}"
    echo "UCX_TLS: ${UCX_TLS} (inherited: ${INHERITED_TLS}); real NIXL ran with: ${NIXL_SETUP}"
    echo
    printf '%-20s %-8s %8s  %s\n' step status took detail
    for s in "${STEPS[@]}"; do
        summary_line "${s}"
        echo
    done
    echo
    echo "== what each step proves"
    for s in "${STEPS[@]}"; do
        printf '%-20s %s\n' "${s}" "${ABOUT[$s]}"
    done
    local first_ucx
    first_ucx="$(find "${LOGS}" -maxdepth 1 -name 'ucx-nixl-canary-*.log*' -print 2>/dev/null | sort | head -n1)"
    if [[ -z "${first_ucx}" ]]; then
        first_ucx="$(find "${LOGS}" -maxdepth 1 -name 'ucx-*.log*' -print 2>/dev/null | sort | head -n1)"
    fi
    if [[ -n "${first_ucx}" ]]; then
        echo
        echo "== UCX and CUDA (${first_ucx##*/}: did UCX's CUDA module load?)"
        grep -hE "libuct_cuda|libucm_cuda|module 'cuda'|cuda_copy|cuda_ipc|detected as host|CUDA support|Version [0-9]" \
            "${first_ucx}" 2>/dev/null | sed 's/^\[[^]]*\] \[[^]]*\] *//' | cut -c1-220 | sort -u | head -n 12 || true
    fi
    local printed=0
    for s in "${BENCH_STEPS[@]}"; do
        local log="${LOGS}/${s}.log"
        [[ -f "${log}" ]] || continue
        if ((!printed)); then
            echo
            echo "== bandwidth (GB/s: decimal payload bytes per second; never compare figures without UCX's protocol)"
            printed=1
        fi
        echo "-- ${s}"
        grep -E '^(READ|WRITE) of|^UCX settings|^NIXL agents|^path |^(copy|copy-per-pair|loopback|nixl|nixl-peer) |skipped:' "${log}" ||
            echo "(no table; see logs/${s}.log)"
        local protos
        protos="$(protocols "${s}")"
        if [[ -n "${protos}" ]]; then
            echo "   UCX protocols (UCX_PROTO_INFO):"
            printf '%s\n' "${protos}" | sed 's/^/     /'
        elif grep -q '^nixl' "${log}"; then
            echo "   UCX protocols: none logged (see logs/ucx-${s}.*.log)"
        fi
        local cuda
        cuda="$(ucx_cuda_lines "${s}")"
        if [[ -n "${cuda}" ]]; then
            echo "   UCX on CUDA (count, line):"
            printf '%s\n' "${cuda}" | sed 's/^/     /'
        fi
    done
    echo
    echo "${RESULT_LINE}"
}

# Cap every log (head and tail) and pack them into logs.tar.gz.
pack_logs() {
    [[ -d "${LOGS}" ]] || return 0
    local f size cap="${LOG_CAP_BYTES}"
    while :; do
        for f in "${LOGS}"/*; do
            [[ -f "${f}" ]] || continue
            size="$(stat -c %s "${f}")"
            if ((size > cap)); then
                {
                    head -c $((cap / 2)) "${f}"
                    printf '\n[... %d bytes cut by gpu-check ...]\n' $((size - cap))
                    tail -c $((cap / 2)) "${f}"
                } >"${f}.cap" && mv "${f}.cap" "${f}"
            fi
        done
        tar -C "${RESULTS}" -czf "${RESULTS}/logs.tar.gz.new" logs 2>/dev/null || true
        mv -f "${RESULTS}/logs.tar.gz.new" "${RESULTS}/logs.tar.gz" 2>/dev/null || true
        size="$(stat -c %s "${RESULTS}/logs.tar.gz" 2>/dev/null || echo 0)"
        if ((size <= RESULT_FILE_LIMIT || cap <= 65536)); then
            break
        fi
        cap=$((cap / 4))
    done
}

finish() {
    local rc=$?
    trap - EXIT INT TERM
    if [[ -n "${CHILD}" ]]; then
        kill -TERM "${CHILD}" 2>/dev/null || true
        wait "${CHILD}" 2>/dev/null || true
    fi
    if ((RESULT_WRITTEN)); then
        exit "${rc}"
    fi
    RESULT_WRITTEN=1
    local failed=0 s
    for s in "${STEPS[@]}"; do
        case "${STATUS[$s]:-}" in
        FAILED | CUT) failed=1 ;;
        "")
            STATUS[$s]="NOT RUN"
            if [[ "${s}" == "${CURRENT}" ]]; then
                STATUS[$s]="CUT"
                local why="exit ${rc}"
                [[ -z "${SIGNALLED}" ]] || why="SIG${SIGNALLED}"
                DETAIL[$s]="interrupted while running (${why}); partial logs in logs/"
                failed=1
                continue
            fi
            if [[ -n "${SIGNALLED}" ]]; then
                DETAIL[$s]="not reached: the run was interrupted (SIG${SIGNALLED})"
            else
                DETAIL[$s]="not reached: the run stopped early (exit ${rc})"
            fi
            ;;
        esac
    done
    if [[ -n "${SIGNALLED}" ]]; then
        RESULT_LINE="RESULT: INTERRUPTED by SIG${SIGNALLED}; steps not reached are listed as NOT RUN (results in ${RESULTS})"
        failed=1
    elif ((rc == 2)); then
        RESULT_LINE="RESULT: stopped by an error (exit 2, see above; results in ${RESULTS})"
        failed=1
    elif ((failed)); then
        RESULT_LINE="RESULT: FAILED or CUT steps above (results in ${RESULTS})"
    else
        RESULT_LINE="RESULT: every step that ran passed (results in ${RESULTS})"
    fi
    full_summary >"${RESULTS}/summary.txt.new" 2>&1 || true
    mv -f "${RESULTS}/summary.txt.new" "${RESULTS}/summary.txt"
    write_figures 2>/dev/null || echo '{"error": "figures could not be written"}' >"${RESULTS}/figures.json"
    pack_logs
    rm -rf "${LOGS}"
    cat "${RESULTS}/summary.txt"
    if ((rc == 2)); then
        exit 2
    elif ((failed)); then
        exit 1
    fi
    exit 0
}

on_signal() {
    SIGNALLED="$1"
    if [[ -n "${CHILD}" ]]; then
        kill -TERM "${CHILD}" 2>/dev/null || true
    fi
    exit 1
}

run_checks() {
    local dir="" budget="${DEFAULT_BUDGET}" results=""
    MEMORY=vram
    BENCH_PROMPT=16384
    BENCH_GEOMETRY=bench/kimi-linear-vram.toml
    EXTRAS=0
    while (($#)); do
        case "$1" in
        --budget)
            budget="${2:-}"
            shift
            ;;
        --results)
            results="${2:-}"
            shift
            ;;
        --bench-prompt)
            BENCH_PROMPT="${2:-}"
            shift
            ;;
        --bench-geometry)
            BENCH_GEOMETRY="${2:-}"
            shift
            ;;
        --host-memory) MEMORY=host ;;
        --extras) EXTRAS=1 ;;
        --quick) die "--quick is gone: every run is budgeted (--budget SECONDS)" ;;
        -h | --help) usage ;;
        -*) die "run: unknown option $1" ;;
        *) dir="$1" ;;
        esac
        shift
    done
    if [[ ! "${budget}" =~ ^[0-9]+$ ]] || ((budget < 20)); then
        die "--budget takes whole seconds, at least 20 (got '${budget}')"
    fi
    if [[ ! "${BENCH_PROMPT}" =~ ^[0-9]+$ ]] || ((BENCH_PROMPT == 0)); then
        die "--bench-prompt takes a positive token count (got '${BENCH_PROMPT}')"
    fi
    BUDGET="${budget}"
    START_MS="$(now_ms)"
    DEADLINE_MS=$((START_MS + budget * 1000 - PACK_RESERVE_MS))
    if [[ -z "${dir}" ]]; then
        if [[ -x "${SCRIPT_DIR}/bin/kvgeom" ]]; then
            dir="${SCRIPT_DIR}"
        else
            dir="$(cd "${SCRIPT_DIR}/.." && pwd)/gpu-check"
        fi
    fi
    [[ -x "${dir}/bin/kvgeom" ]] || die "no packed kvgeom in ${dir}/bin (run \`scripts/gpu-check.sh pack\` first)"
    DIR="$(cd "${dir}" && pwd)"
    RESULTS="${results:-${DIR}/results}"
    mkdir -p "${RESULTS}"
    RESULTS="$(cd "${RESULTS}" && pwd)"
    LOGS="${RESULTS}/logs"
    rm -rf "${LOGS}" "${RESULTS}/summary.txt" "${RESULTS}/figures.json" "${RESULTS}/logs.tar.gz"
    mkdir -p "${LOGS}"
    cd "${DIR}"
    [[ -f "${BENCH_GEOMETRY}" ]] || die "--bench-geometry: no file ${BENCH_GEOMETRY} in ${DIR}"
    KVGEOM="${DIR}/bin/kvgeom"
    GPU_LINE="not checked"
    DRIVER_LINE="not checked"
    NIXL_SETUP="none (no canary passed)"
    NIXL_OK=0
    NIXL_ENV=()
    DEVICE_OK=0
    CANARY_MS_PER_CASE=1000
    RESULT_LINE="RESULT: not finished"
    INHERITED_ENV="$(env | grep -E '^(UCX_|CUDA_|NVIDIA_|NIXL_|KVGEOM_|LD_LIBRARY_PATH=|LD_PRELOAD=)' | sort || true)"
    INHERITED_ENV="${INHERITED_ENV:-(none of UCX_*, CUDA_*, NVIDIA_*, NIXL_*, KVGEOM_*, LD_LIBRARY_PATH, LD_PRELOAD)}"
    INHERITED_TLS="${UCX_TLS-unset}"
    trap finish EXIT
    trap 'on_signal TERM' TERM
    trap 'on_signal INT' INT
    {
        echo "== kvgeom GPU check: ${DIR}, budget ${budget} s, ${MEMORY} memory, started $(date -u +%Y-%m-%dT%H:%M:%SZ)"
        printf '%-20s %-8s %8s  %s\n' step status took detail
    } >"${RESULTS}/summary.txt"

    # The NIXL runtime, unpacked next to the binaries (within the budget).
    if [[ ! -f "${DIR}/.nixl-runtime/.installed" ]]; then
        [[ -f "${DIR}/nixl-runtime.tar.xz" ]] || die "no nixl-runtime.tar.xz in ${DIR}"
        timeout -k 5 120 tar -C "${DIR}" -xJf "${DIR}/nixl-runtime.tar.xz" >"${LOGS}/unpack.log" 2>&1 ||
            die "could not unpack nixl-runtime.tar.xz (see ${LOGS}/unpack.log)"
    fi
    local libs="${DIR}/.nixl-runtime/.nixl_cu13.mesonpy.libs"
    UCX_MODULES="${DIR}/.nixl-runtime/nixl_cu13.libs/ucx"
    CUDART="$(find_cudart)"
    export LD_LIBRARY_PATH="${libs}${CUDART:+:${CUDART}}${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}"
    export NIXL_PLUGIN_DIR="${libs}/plugins"
    export KVGEOM_ROOT="${DIR}"
    # UCX_TLS is an allow-list: device memory needs the CUDA transports in it
    # (without cuda_copy UCX takes VRAM for host memory). Whatever was
    # inherited is recorded above and replaced.
    if [[ "${MEMORY}" == vram ]]; then
        export UCX_TLS="${VRAM_TLS}"
    else
        export UCX_TLS="${HOST_TLS}"
    fi
    export UCX_NET_DEVICES=lo
    note "UCX_TLS=${UCX_TLS} (inherited: ${INHERITED_TLS})"
    # No wait inside a step may outlast the step.
    export KVGEOM_COMPLETION_LIMIT_S="${KVGEOM_COMPLETION_LIMIT_S:-20}"
    export KVGEOM_BENCH_STALL_LIMIT_S="${KVGEOM_BENCH_STALL_LIMIT_S:-60}"
    export KVGEOM_PEER_TIMEOUT_S="${KVGEOM_PEER_TIMEOUT_S:-60}"

    step_machine
    step_device
    step_vram_loopback_sweep
    step_nixl_canary
    step_bench_in_process
    step_bench_peer bench-peer-write write
    step_bench_peer bench-peer-read read
    step_nixl_sweep
    step_gpu_tests_rest
    # vLLM 0.33.0's agents: spinning progress threads, 4 UCX threads.
    step_extra extra-vllm-agents KVGEOM_NIXL_PROGRESS_DELAY_US=0 KVGEOM_NIXL_UCX_THREADS=4 -- \
        --paths nixl
    step_extra extra-get-zcopy UCX_CUDA_IPC_ENABLE_GET_ZCOPY=on -- --peer-process --paths nixl-peer
}

case "${1:-}" in
pack)
    shift
    pack "$@"
    ;;
run)
    shift
    run_checks "$@"
    ;;
*) usage ;;
esac
