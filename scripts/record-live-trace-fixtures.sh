#!/usr/bin/env bash
# Re-record the v2 trace fixtures of one vLLM release
# (tests/fixtures/live-traces-vllm-<release>/) with that release's own
# connector, from their names:
#   <geometry>-<pull|push>-n<prompt>-hit<prefix hit>-<mainline|with-last-token>-s<seed>
# where <geometry> is geometries/<geometry>.toml.
#
# Usage: scripts/record-live-trace-fixtures.sh [--release X] [--vllm-python PATH] [NAME ...]
#   --release X: the release whose fixtures are recorded (default: the
#     project venv's, .vllm-venv/); its interpreter is the project venv's
#     when that has X, else .vllm-venvs/X/bin/python
#     (`scripts/install-vllm.sh --version X`).
#   --vllm-python PATH: the interpreter to record with instead; it must
#     have the release (exit 2 otherwise).
#   NAME ...: the fixtures to record (default: every fixture already in
#     the release's folder). A new fixture also needs its pinned verdicts
#     in tests/traces/ (trace_v2.rs for 0.33.0, trace_v2_releases.rs for
#     other releases).
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"

release=""
python=""
names=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --release)
            [[ $# -ge 2 ]] || { echo "--release needs a version, e.g. 0.34.0" >&2; exit 2; }
            release="$2"
            shift 2
            ;;
        --vllm-python)
            [[ $# -ge 2 ]] || { echo "--vllm-python needs a path" >&2; exit 2; }
            python="$2"
            shift 2
            ;;
        -*)
            echo "unknown option $1 (expected --release X, --vllm-python PATH, fixture names)" >&2
            exit 2
            ;;
        *)
            names+=("$1")
            shift
            ;;
    esac
done

# The vLLM version an interpreter has (empty when it has none).
vllm_version() {
    "$1" -c 'import importlib.metadata as m; print(m.version("vllm"))' 2>/dev/null || true
}

project_python="$repo/.vllm-venv/bin/python"
if [[ -z "$python" ]]; then
    if [[ -z "$release" ]]; then
        python="$project_python"
    elif [[ -x "$project_python" && "$(vllm_version "$project_python")" == "$release" ]]; then
        python="$project_python"
    else
        python="$repo/.vllm-venvs/$release/bin/python"
    fi
fi
if [[ ! -x "$python" ]]; then
    echo "no interpreter at $python: install the release with scripts/install-vllm.sh${release:+ --version $release}" >&2
    exit 2
fi
has="$(vllm_version "$python")"
if [[ -z "$has" ]]; then
    echo "$python has no vLLM installed" >&2
    exit 2
fi
if [[ -z "$release" ]]; then
    release="$has"
elif [[ "$has" != "$release" ]]; then
    echo "$python has vLLM $has, not $release" >&2
    exit 2
fi
dir="$repo/tests/fixtures/live-traces-vllm-$release"
mkdir -p "$dir"

if [[ ${#names[@]} -eq 0 ]]; then
    for f in "$dir"/*.trace.json.gz; do
        [[ -e "$f" ]] || continue
        names+=("$(basename "$f" .trace.json.gz)")
    done
fi
if [[ ${#names[@]} -eq 0 ]]; then
    echo "no fixture names given and none in $dir" >&2
    exit 2
fi

cargo build --quiet
for name in "${names[@]}"; do
    if [[ ! "$name" =~ ^(.+)-(pull|push)-n([0-9]+)-hit([0-9]+)-(mainline|with-last-token)-s([0-9]+)$ ]]; then
        echo "$name: not <geometry>-<mode>-n<N>-hit<H>-<alloc>-s<seed>" >&2
        exit 2
    fi
    geometry="geometries/${BASH_REMATCH[1]}.toml"
    if [[ ! -f "$geometry" ]]; then
        echo "$name: no $geometry" >&2
        exit 2
    fi
    # explain exits 1 when the case fails its oracles: many fixtures are a
    # release's failures, so only the trace's presence is required.
    # Recorded beside the fixture first: a failed recording keeps the old one.
    fresh="$dir/.$name.trace.json.gz"
    rm -f "$fresh"
    ./target/debug/kvgeom explain "$geometry" --connector vllm \
        --vllm-python "$python" \
        --mode "${BASH_REMATCH[2]}" --prompt "${BASH_REMATCH[3]}" \
        --prefix-hit "${BASH_REMATCH[4]}" --alloc "${BASH_REMATCH[5]}" \
        --seed "${BASH_REMATCH[6]}" --record-trace "$fresh" \
        >/dev/null || true
    if [[ ! -s "$fresh" ]]; then
        rm -f "$fresh"
        echo "$name: no trace recorded" >&2
        exit 1
    fi
    mv "$fresh" "$dir/$name.trace.json.gz"
    echo "recorded $name (vLLM $release)"
done
