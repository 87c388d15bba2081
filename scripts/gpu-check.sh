#!/usr/bin/env bash
# The GPU device check of kvgeom, in two halves:
#
#   scripts/gpu-check.sh pack [DIR]
#       On a build machine (x86-64 Linux, cargo, libclang; network only if the
#       NIXL runtime is not installed yet): builds a release kvgeom with
#       `--features nixl,cuda` and the GPU test binary (tests/gpu.rs), and packs
#       them with the trimmed NIXL runtime (tar.xz), the geometries and this
#       script into DIR (default: gpu-check/ at the project root), under 64 MiB.
#
#   DIR/gpu-check.sh run [--quick] [DIR]
#       On any machine with an NVIDIA driver and the CUDA 13 runtime
#       (libcudart.so.13; no network needed): runs the GPU tests, the default
#       sweep on host memory, the same sweep on VRAM over the loopback transport
#       and over real NIXL, each compared with the host run case by case, then
#       the VRAM bandwidth benchmark in several UCX set-ups, and prints a
#       summary. Logs go to DIR/results/. `--quick` limits the real-NIXL sweep
#       to a few prompt lengths per geometry and runs fewer benchmark variants.
#       `--host-memory` runs the same steps on host memory instead of VRAM
#       (to try the pack on a machine without a GPU; the GPU tests then skip).
#       Exit status: 0 when every check passed, 1 otherwise.
#
# Environment: CUDA_HOME (where to look for libcudart.so.13 first),
# KVGEOM_GPU_CHECK_TIMEOUT (seconds per step, default 3600).
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PACK_LIMIT_BYTES=$((64 * 1024 * 1024))
STEP_TIMEOUT="${KVGEOM_GPU_CHECK_TIMEOUT:-3600}"

die() {
    echo "gpu-check: error: $*" >&2
    exit 2
}

note() {
    echo "gpu-check: $*" >&2
}

usage() {
    sed -n '2,22p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
    exit 2
}

# ---------------------------------------------------------------- pack

pack() {
    local root dest target json tests_exe
    root="$(cd "${SCRIPT_DIR}/.." && pwd)"
    [[ -f "${root}/Cargo.toml" ]] || die "pack runs from a kvgeom checkout (no Cargo.toml above ${SCRIPT_DIR})"
    dest="${1:-${root}/gpu-check}"
    command -v cargo >/dev/null || die "cargo is needed to build"
    command -v xz >/dev/null || die "xz is needed to pack the NIXL runtime"
    cd "${root}"
    target="${CARGO_TARGET_DIR:-${root}/target}"

    note "building kvgeom (release, --features nixl,cuda)"
    cargo build --release --features nixl,cuda --bin kvgeom >&2
    note "building the GPU test binary (release, --features nixl,cuda)"
    json="$(cargo test --release --features nixl,cuda --test gpu --no-run --message-format=json)"
    tests_exe="$(printf '%s\n' "${json}" | grep '"name":"gpu"' | grep -o '"executable":"[^"]*"' |
        tail -n1 | sed 's/^"executable":"//; s/"$//')"
    [[ -n "${tests_exe}" && -x "${tests_exe}" ]] || die "cargo did not report the gpu test executable"

    if [[ ! -f "${root}/.nixl-runtime/.installed" ]]; then
        note "installing the NIXL runtime first"
        "${root}/scripts/install-nixl-runtime.sh" >&2
    fi

    rm -rf "${dest}"
    mkdir -p "${dest}/bin"
    cp "${target}/release/kvgeom" "${dest}/bin/kvgeom"
    cp "${tests_exe}" "${dest}/bin/gpu-tests"
    if command -v strip >/dev/null; then
        strip "${dest}/bin/kvgeom" "${dest}/bin/gpu-tests"
    fi
    cp -r "${root}/geometries" "${root}/bench" "${dest}/"
    cp "${root}/scripts/gpu-check.sh" "${dest}/gpu-check.sh"
    note "packing the NIXL runtime (tar.xz)"
    tar -C "${root}" --exclude=.nixl-runtime/env.sh -cJf "${dest}/nixl-runtime.tar.xz" .nixl-runtime
    {
        echo "kvgeom device check pack"
        echo "commit: $(git -C "${root}" rev-parse HEAD 2>/dev/null || echo unknown)"
        echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -srm)"
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

# ---------------------------------------------------------------- run

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

declare -a SUMMARY=()
FAILED=0

# record NAME STATUS DETAIL
record() {
    SUMMARY+=("$(printf '%-34s %-8s %s' "$1" "$2" "$3")")
    if [[ "$2" == "FAILED" ]]; then
        FAILED=1
    fi
}

# step NAME LOG -- COMMAND...: run with a timeout, log stdout+stderr, return its status.
step() {
    local name="$1" log="$2" status
    shift 3
    note "${name}: $* (log: ${log})"
    set +e
    timeout "${STEP_TIMEOUT}" "$@" >"${log}" 2>&1
    status=$?
    set -e
    if ((status == 124)); then
        echo "gpu-check: ${name} timed out after ${STEP_TIMEOUT} s" >>"${log}"
    fi
    return "${status}"
}

# "N cases, N passed, N failed" from a sweep's JSON report.
counts() {
    local key parts=()
    for key in cases passed failed; do
        parts+=("$(grep -m1 -o "\"${key}\": [0-9]*" "$1" 2>/dev/null | grep -o '[0-9]*$' || echo '?') ${key}")
    done
    echo "${parts[0]}, ${parts[1]}, ${parts[2]}"
}

# sweep NAME OUT ARGS...: a default sweep with its JSON report in RESULTS/OUT.json.
sweep() {
    local name="$1" out="$2"
    shift 2
    if step "${name}" "${RESULTS}/${out}.txt" -- "${KVGEOM}" sweep geometries --no-shrink \
        --format json --out "${RESULTS}/${out}.json" "$@"; then
        record "${name}" "ok" "$(counts "${RESULTS}/${out}.json")$(grep -q 'all .* cases give the same' "${RESULTS}/${out}.txt" && echo '; same as host')"
    else
        record "${name}" "FAILED" "$(grep -m1 -E 'error|differences|cases failed|timed out' "${RESULTS}/${out}.txt" || counts "${RESULTS}/${out}.json")"
    fi
}

# bench NAME OUT COMMAND...: one benchmark run, UCX telling its protocol
# choices in RESULTS/ucx-OUT.<pid>.log (one per process).
bench() {
    local name="$1" out="$2"
    shift 2
    if step "${name}" "${RESULTS}/${out}.txt" -- env UCX_PROTO_INFO=y \
        UCX_LOG_FILE="${RESULTS}/ucx-${out}.%p.log" "$@"; then
        record "${name}" "ok" "see ${out}.txt"
    else
        record "${name}" "FAILED" "$(grep -m1 -E '^error|timed out' "${RESULTS}/${out}.txt" || echo "see ${out}.txt")"
    fi
}

# protocols OUT: the RMA protocols UCX chose in a benchmark's processes
# ("<operation> => <size range> | <protocol> | <transport>").
protocols() {
    local logs=("${RESULTS}/ucx-$1".*.log)
    [[ -e "${logs[0]}" ]] || return 0
    echo "   UCX protocols (UCX_PROTO_INFO):"
    awk '
        { sub(/^\[[^]]*\] \[[^]]*\] +/, "") }
        /remote memory (read|write) by ucp_/ { hdr = $0; gsub(/^\| *| *\|$/, "", hdr); next }
        /^\+/ && !/Range/ { next }
        /^\| +[0-9]+\.\./ && hdr != "" {
            row = $0; gsub(/^\| *| *\|$/, "", row); gsub(/ +\| +/, " | ", row)
            print hdr " => " row
        }
        /by ucp_am/ { hdr = "" }
    ' "${logs[@]}" | sort -u | head -n 24 | sed 's/^/     /'
}

run_checks() {
    local quick=0 dir="" memory=vram
    while (($#)); do
        case "$1" in
        --quick) quick=1 ;;
        --host-memory) memory=host ;;
        -h | --help) usage ;;
        *) dir="$1" ;;
        esac
        shift
    done
    if [[ -z "${dir}" ]]; then
        if [[ -x "${SCRIPT_DIR}/bin/kvgeom" ]]; then
            dir="${SCRIPT_DIR}"
        else
            dir="$(cd "${SCRIPT_DIR}/.." && pwd)/gpu-check"
        fi
    fi
    [[ -x "${dir}/bin/kvgeom" ]] || die "no packed kvgeom in ${dir}/bin (run \`scripts/gpu-check.sh pack\` first)"
    dir="$(cd "${dir}" && pwd)"
    cd "${dir}"
    RESULTS="${dir}/results"
    KVGEOM="${dir}/bin/kvgeom"
    mkdir -p "${RESULTS}"

    # NIXL runtime, unpacked next to the binaries.
    if [[ ! -f "${dir}/.nixl-runtime/.installed" ]]; then
        [[ -f "${dir}/nixl-runtime.tar.xz" ]] || die "no nixl-runtime.tar.xz in ${dir}"
        tar -C "${dir}" -xJf "${dir}/nixl-runtime.tar.xz"
    fi
    local libs="${dir}/.nixl-runtime/.nixl_cu13.mesonpy.libs"
    local cudart
    cudart="$(find_cudart)"
    export LD_LIBRARY_PATH="${libs}${cudart:+:${cudart}}${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}"
    export NIXL_PLUGIN_DIR="${libs}/plugins"
    export KVGEOM_ROOT="${dir}"
    # In-process and same-node agents: loopback TCP and shared memory for
    # control, the CUDA transports for device memory.
    export UCX_TLS="${UCX_TLS:-tcp,sm,self,cuda_copy,cuda_ipc}"
    export UCX_NET_DEVICES="${UCX_NET_DEVICES:-lo}"

    {
        echo "pack: $(head -n2 "${dir}/MANIFEST" 2>/dev/null | tail -n1)"
        echo "host: $(uname -srm)"
        if command -v nvidia-smi >/dev/null; then
            nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || true
        else
            echo "nvidia-smi: not found"
        fi
        echo "libcudart.so.13: ${cudart:-not found (the CUDA transports of UCX will not load)}"
        echo "UCX_TLS=${UCX_TLS} UCX_NET_DEVICES=${UCX_NET_DEVICES}"
    } | tee "${RESULTS}/machine.txt" >&2
    if [[ -z "${cudart}" ]]; then
        record "CUDA 13 runtime" "WARN" "libcudart.so.13 not found; set CUDA_HOME"
    fi

    # 1. GPU tests.
    if step "gpu tests" "${RESULTS}/gpu-tests.txt" -- "${dir}/bin/gpu-tests"; then
        record "gpu tests" "ok" "$(tail -n1 "${RESULTS}/gpu-tests.txt")"
    else
        record "gpu tests" "FAILED" "$(grep -m1 -E 'FAILED|timed out' "${RESULTS}/gpu-tests.txt" || tail -n1 "${RESULTS}/gpu-tests.txt")"
    fi
    if grep -q 'skipped' "${RESULTS}/gpu-tests.txt"; then
        record "gpu tests: skipped cases" "WARN" "$(grep -c '\.\.\. skipped' "${RESULTS}/gpu-tests.txt") skipped, see gpu-tests.txt"
    fi

    # 2. The default sweep on host memory (the reference), then on VRAM.
    sweep "host sweep (loopback)" reference-host
    sweep "${memory} sweep (loopback) vs host" "${memory}-loopback" --memory "${memory}" \
        --transport loopback --compare-host
    if ((quick)); then
        sweep "${memory} sweep (nixl, quick) vs host" "${memory}-nixl" --memory "${memory}" \
            --transport nixl --compare-host --prompts 2,5,13,29,64,769
    else
        sweep "${memory} sweep (nixl) vs host" "${memory}-nixl" --memory "${memory}" \
            --transport nixl --compare-host
    fi

    # 3. Bandwidth: one KimiLinear-scale request, several UCX set-ups.
    bench "bench: copies, loopback, nixl" bench-in-process \
        "${KVGEOM}" bench vram --memory "${memory}" --paths copy,copy-per-pair,loopback,nixl
    bench "bench: nixl, peer process (READ)" bench-peer-read \
        "${KVGEOM}" bench vram --memory "${memory}" --peer-process --paths nixl-peer
    bench "bench: nixl, peer process (WRITE)" bench-peer-write \
        "${KVGEOM}" bench vram --memory "${memory}" --peer-process --op write --paths nixl-peer
    # vLLM 0.33.0's agent settings (spinning progress threads, 4 UCX
    # threads) against kvgeom's (10 us progress delay, UCX's default).
    bench "bench: nixl, vLLM agent settings" bench-vllm-agents \
        env KVGEOM_NIXL_PROGRESS_DELAY_US=0 KVGEOM_NIXL_UCX_THREADS=4 \
        "${KVGEOM}" bench vram --memory "${memory}" --paths nixl
    if ((!quick)); then
        bench "bench: nixl, peer, vLLM agent settings" bench-peer-read-vllm-agents \
            env KVGEOM_NIXL_PROGRESS_DELAY_US=0 KVGEOM_NIXL_UCX_THREADS=4 \
            "${KVGEOM}" bench vram --memory "${memory}" --peer-process --paths nixl-peer
        bench "bench: nixl, same-process cuda_ipc" bench-same-process-ipc \
            env UCX_CUDA_IPC_ENABLE_SAME_PROCESS=y "${KVGEOM}" bench vram --memory "${memory}" --paths nixl
        bench "bench: nixl, peer, GET zcopy on" bench-peer-read-get-zcopy \
            env UCX_CUDA_IPC_ENABLE_GET_ZCOPY=on "${KVGEOM}" bench vram --memory "${memory}" --peer-process --paths nixl-peer
    fi

    echo
    echo "== kvgeom GPU check: ${dir}"
    cat "${RESULTS}/machine.txt"
    echo
    printf '%s\n' "${SUMMARY[@]}"
    echo
    echo "== bandwidth (GB/s are decimal payload bytes per second; see each log for UCX's protocol choice)"
    local f
    for f in "${RESULTS}"/bench-*.txt; do
        [[ -e "${f}" ]] || continue
        echo "-- $(basename "${f}" .txt)"
        grep -E '^(READ|WRITE) of|^UCX settings|^NIXL agents|^(copy|copy-per-pair|loopback|nixl|nixl-peer) |skipped:' "${f}" || echo "(no table; see the log)"
        protocols "$(basename "${f}" .txt)"
    done
    echo
    if ((FAILED)); then
        echo "RESULT: FAILED (logs in ${RESULTS})"
        return 1
    fi
    echo "RESULT: all checks passed (logs in ${RESULTS})"
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
