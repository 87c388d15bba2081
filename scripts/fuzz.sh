#!/usr/bin/env bash
# Run the cargo-fuzz targets on the stable toolchain (no sanitizer), each for
# SECONDS (default 60), with its corpus in fuzz/corpus/<target>, its
# dictionary from fuzz/dictionaries/ and seeds from the repository: the
# shipped geometries for geometry_file, the vLLM trace fixtures (gunzipped)
# for trace. Installs cargo-fuzz when it is missing.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]     default: every target
#
# FUZZ_CORPUS=DIR uses DIR instead of fuzz/corpus/<target> (a fresh folder
# starts from scratch, e.g. for a defect hunt); FUZZ_FLAGS adds libFuzzer
# flags. docs/fuzzing.md explains the targets and how to replay a crash.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

seconds="${1:-60}"
shift || true

if ! command -v cargo-fuzz >/dev/null; then
    cargo install cargo-fuzz --locked
fi

targets=("$@")
if ((${#targets[@]} == 0)); then
    mapfile -t targets < <(cargo fuzz list)
fi

cargo fuzz build --sanitizer none

seeds="$(mktemp -d)"
trap 'rm -rf "${seeds}"' EXIT
mkdir -p "${seeds}/geometry_file" "${seeds}/trace"
cp geometries/*.toml "${seeds}/geometry_file/"
for trace in tests/fixtures/vllm-0.33.0/*.jsonl.gz; do
    gunzip -c "${trace}" >"${seeds}/trace/$(basename "${trace}" .gz)"
done

# Inputs longer than the generators read are wasted effort.
max_len() {
    case "$1" in
        scenario) echo "-max_len=256" ;;
        plan) echo "-max_len=512" ;;
        lifecycle) echo "-max_len=512" ;;
    esac
}

for target in "${targets[@]}"; do
    corpus="${FUZZ_CORPUS:-fuzz/corpus/${target}}"
    mkdir -p "${corpus}"
    dirs=("${corpus}")
    if [[ -z "${FUZZ_CORPUS:-}" && -d "${seeds}/${target}" ]]; then
        dirs+=("${seeds}/${target}")
    fi
    flags=("-max_total_time=${seconds}" "-timeout=30" "-print_final_stats=1")
    if [[ -f "fuzz/dictionaries/${target}.dict" ]]; then
        flags+=("-dict=fuzz/dictionaries/${target}.dict")
    fi
    limit="$(max_len "${target}")"
    if [[ -n "${limit}" ]]; then
        flags+=("${limit}")
    fi
    # shellcheck disable=SC2206 # FUZZ_FLAGS is a list of flags
    flags+=(${FUZZ_FLAGS:-})
    echo "==> cargo fuzz run ${target} (${seconds} s)"
    cargo fuzz run "${target}" --sanitizer none "${dirs[@]}" -- "${flags[@]}"
done
