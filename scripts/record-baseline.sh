#!/usr/bin/env bash
# Record what one kvgeom binary says about the committed inputs, so a
# refactor can be checked case by case against it:
#
#   scripts/record-baseline.sh target/release/kvgeom DIR
#   scripts/compare-reports.py --baseline DIR-before DIR-after
#
# Recorded: the default sweep under both policies, mutants over
# geometries/*.toml, the live sweep over geometries/*.toml (skipped with a
# line when no vLLM venv is installed), check-trace and diff-trace over
# tests/fixtures/, and the explain text of prompt 13 (pull and push) of
# every geometry file. Each command's exit status goes to DIR/status.
set -u
bin=${1:?usage: record-baseline.sh KVGEOM_BINARY OUT_DIR}
out=${2:?usage: record-baseline.sh KVGEOM_BINARY OUT_DIR}
bin=$(realpath "$bin")
cd "$(dirname "$0")/.."
mkdir -p "$out/explain"
: > "$out/status"
record() { # NAME COMMAND...
    local name=$1; shift
    "$@" > "$out/$name" 2> "$out/$name.stderr"
    echo "$name $?" >> "$out/status"
}
record sweep-kvgeom.json "$bin" sweep --format json
record sweep-vllm-0.33.0.json "$bin" sweep --policy vllm-0.33.0 --format json
record mutants.json "$bin" mutants geometries/*.toml --format json
record check-trace.json "$bin" check-trace --format json tests/fixtures/
record diff-trace.json "$bin" diff-trace --format json tests/fixtures/
if [ -x .vllm-venv/bin/python ]; then
    record live.json "$bin" sweep --connector vllm geometries/*.toml --format json
else
    echo "live: skipped, no .vllm-venv/ (run scripts/install-vllm.sh)" >> "$out/status"
fi
for f in geometries/*.toml geometries/models/*.toml; do
    name=$(basename "$f" .toml)
    for mode in pull push; do
        record "explain/$name-$mode.txt" "$bin" explain "$f" --prompt 13 --mode "$mode"
    done
done
echo "baseline in $out"
