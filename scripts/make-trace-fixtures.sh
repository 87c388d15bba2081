#!/usr/bin/env bash
# Regenerate tests/fixtures/vllm-0.33.0/ from a folder of vLLM NIXL geometry
# traces (vllm-nixl-geometry-trace/1, *.jsonl or *.jsonl.gz).
#
# Usage: scripts/make-trace-fixtures.sh [SRC] [DST]
#   SRC defaults to $KVGEOM_VLLM_TRACES, DST to tests/fixtures/vllm-0.33.0.
# The output is deterministic: regenerating from the same traces gives the
# same bytes. Files in DST that have no source are left alone.
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
src="${1:-${KVGEOM_VLLM_TRACES:-}}"
dst="${2:-$repo/tests/fixtures/vllm-0.33.0}"
if [[ -z "$src" ]]; then
    echo "usage: $0 SRC [DST]  (or set KVGEOM_VLLM_TRACES)" >&2
    exit 2
fi

cd "$repo"
cargo run --quiet --example make_trace_fixtures -- "$src" "$dst"
