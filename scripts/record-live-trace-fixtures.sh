#!/usr/bin/env bash
# Re-record the v2 trace fixtures (tests/fixtures/live-traces-vllm-0.33.0/)
# with vLLM's own connector, from their names:
#   <geometry>-<pull|push>-n<prompt>-hit<prefix hit>-<mainline|with-last-token>-s<seed>
# where <geometry> is geometries/<geometry>.toml.
#
# Usage: scripts/record-live-trace-fixtures.sh [NAME ...]
#   (default: every fixture already in the folder). Needs the vLLM venv
#   (scripts/install-vllm.sh). A new fixture also needs its pinned verdicts
#   in tests/traces/trace_v2.rs.
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
dir="$repo/tests/fixtures/live-traces-vllm-0.33.0"
cd "$repo"

names=("$@")
if [[ ${#names[@]} -eq 0 ]]; then
    for f in "$dir"/*.trace.json.gz; do
        names+=("$(basename "$f" .trace.json.gz)")
    done
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
    # explain exits 1 when the case fails its oracles: many fixtures are
    # vLLM 0.33.0's failures, so only the trace's presence is required.
    # Recorded beside the fixture first: a failed recording keeps the old one.
    fresh="$dir/.$name.trace.json.gz"
    rm -f "$fresh"
    ./target/debug/kvgeom explain "$geometry" --connector vllm \
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
    echo "recorded $name"
done
