#!/usr/bin/env bash
# Record a corpus of v1 traces (and the v2 trace of each same case) from
# vLLM 0.33.0's real pull worker, with the live driver on CPU, and write
# their true verdicts (scripts/v1-trace-truth.py) into OUT/truth.json.
#
# Usage: scripts/record-v1-trace-corpus.sh [--fixtures] [OUT]
#   (OUT default: target/v1-trace-corpus). With --fixtures, the sample
#   below is then copied into tests/fixtures/vllm-0.33.0-v1-corpus/ (each v1
#   file with its case's v2 trace, GQA cases v1 only) and its truth.json
#   (with the reproducers of tests/fixtures/vllm-0.33.0-v1-reproducers/)
#   rewritten.
#
# Needs vLLM 0.33.0's venv (scripts/install-vllm.sh --version 0.33.0
# --torch-from .vllm-venv; KVGEOM_VLLM_PYTHON names another). What it records (pull only:
# a v1 trace is one decode rank's reads):
#   prefix/      MLA + 2 KDA with prefix caching on D, equal geometry and
#                with a kernel-block ratio, prompts 9..=50, both decode
#                allocations: prefix hits of 0, 1, 2 and 3 logical blocks
#                (the sweep's hits: one block and the most whole blocks
#                short of the transferred tokens)
#   decode-tp/   P TP1 -> D TP2 (one v1 file per decode rank), prompts 9..=40
#   gqa/         GQA + Mamba2 (Nemotron-H), prompts 9..=40: kvgeom's v1
#                reader refuses GQA
#   all/         every geometries/*.toml at prompts 9, 13, 21 and 37
# Measured: 1 min 54 s to 2 min 20 s for 830 v1 traces and 730 v2 (--fixtures
# adds a second) on a 2-core machine shared with other work; a re-recording
# gives the same truth.json (docs/trace-format.md, "Recording").
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
fixtures=0
if [[ "${1:-}" == "--fixtures" ]]; then
    fixtures=1
    shift
fi
out="${1:-$repo/target/v1-trace-corpus}"
cd "$repo"
cargo build --release --quiet
kvgeom="$repo/target/release/kvgeom"
python="${KVGEOM_VLLM_PYTHON:-$repo/.vllm-venvs/0.33.0/bin/python}"
rm -rf "$out"
mkdir -p "$out"
start=$(date +%s)

record() {
    local dir="$1"
    shift
    # The sweep exits 1 when some case fails its oracles: vLLM 0.33.0's
    # known failures are part of the corpus.
    "$kvgeom" sweep --connector vllm --mode pull --threads 1 \
        --record-traces "$out/$dir" "$@" >"$out/$dir.txt" 2>&1 || true
    echo "$dir: $(ls "$out/$dir" | grep -c '\.jsonl\.gz$') v1 traces, $(ls "$out/$dir" | grep -c '\.trace\.json\.gz$') v2"
}

record prefix --prompts 9..=50 \
    geometries/mla-kda-equal-ppl-prefix-cache.toml \
    geometries/mla-kda-kernel-ratio-equal-ppl-prefix-cache.toml
record decode-tp --prompts 9..=40 geometries/mla-kda-decode-tp2.toml
record gqa --prompts 9..=40 geometries/nemotron-h-gqa-mamba2-hnd.toml
record all --prompts 9,13,21,37 geometries/*.toml

(cd "$out" && python3 "$repo/scripts/v1-trace-truth.py" --manifest prefix decode-tp gqa all >truth.json)
echo "recorded in $(( $(date +%s) - start )) s; truths in $out/truth.json"

[[ $fixtures -eq 1 ]] || exit 0

# The committed sample: <folder>/<case>-d<rank>; "v1:" = without the v2 trace.
sample=(
    prefix/mla-kda-equal-ppl-prefix-cache-pull-n9-hit0-mainline-s0-d0
    prefix/mla-kda-equal-ppl-prefix-cache-pull-n18-hit16-mainline-s0-d0
    prefix/mla-kda-equal-ppl-prefix-cache-pull-n18-hit16-with-last-token-s0-d0
    prefix/mla-kda-equal-ppl-prefix-cache-pull-n21-hit16-mainline-s0-d0
    prefix/mla-kda-equal-ppl-prefix-cache-pull-n33-hit16-mainline-s0-d0
    prefix/mla-kda-equal-ppl-prefix-cache-pull-n33-hit16-with-last-token-s0-d0
    prefix/mla-kda-equal-ppl-prefix-cache-pull-n34-hit32-mainline-s0-d0
    prefix/mla-kda-equal-ppl-prefix-cache-pull-n34-hit32-with-last-token-s0-d0
    prefix/mla-kda-equal-ppl-prefix-cache-pull-n40-hit32-with-last-token-s0-d0
    prefix/mla-kda-equal-ppl-prefix-cache-pull-n50-hit48-mainline-s0-d0
    prefix/mla-kda-equal-ppl-prefix-cache-pull-n50-hit48-with-last-token-s0-d0
    prefix/mla-kda-kernel-ratio-equal-ppl-prefix-cache-pull-n21-hit16-mainline-s0-d0
    prefix/mla-kda-kernel-ratio-equal-ppl-prefix-cache-pull-n21-hit16-with-last-token-s0-d0
    prefix/mla-kda-kernel-ratio-equal-ppl-prefix-cache-pull-n33-hit16-with-last-token-s0-d0
    prefix/mla-kda-kernel-ratio-equal-ppl-prefix-cache-pull-n40-hit32-mainline-s0-d0
    prefix/mla-kda-kernel-ratio-equal-ppl-prefix-cache-pull-n50-hit48-with-last-token-s0-d0
    decode-tp/mla-kda-decode-tp2-pull-n10-hit0-mainline-s0-d0
    decode-tp/mla-kda-decode-tp2-pull-n10-hit0-mainline-s0-d1
    decode-tp/mla-kda-decode-tp2-pull-n13-hit0-with-last-token-s0-d0
    decode-tp/mla-kda-decode-tp2-pull-n13-hit0-with-last-token-s0-d1
    decode-tp/mla-kda-decode-tp2-pull-n37-hit0-mainline-s0-d0
    decode-tp/mla-kda-decode-tp2-pull-n37-hit0-mainline-s0-d1
    v1:gqa/nemotron-h-gqa-mamba2-hnd-pull-n13-hit0-mainline-s0-d0
    v1:gqa/nemotron-h-gqa-mamba2-hnd-pull-n21-hit0-with-last-token-s0-d0
    v1:all/qwen3-next-gqa-gdn-decode-tp2-pull-n13-hit0-mainline-s0-d1
    v1:all/mamba2-replicated-groups-p4-d2-pull-n13-hit0-mainline-s0-d0
    all/mla-kda-push-prefix-cache-prefill-kernel-larger-pull-n21-hit8-mainline-s0-d0
    all/mla-kda-push-prefix-cache-prefill-kernel-larger-pull-n37-hit32-with-last-token-s0-d0
    all/deepseek-mla-pull-n13-hit0-mainline-s0-d0
    all/mla-kernel-ratio4-prefix-cache-pull-n37-hit16-mainline-s0-d0
    all/mla-decode-logical-larger-pull-n9-hit0-mainline-s0-d0
    all/g5-mla-kda-mixed-kernel-pull-n13-hit0-mainline-s0-d0
    all/g2-mla-kda-ppl9-vs-2-pull-n21-hit0-with-last-token-s0-d0
)
dest="$repo/tests/fixtures/vllm-0.33.0-v1-corpus"
rm -f "$dest"/*.jsonl.gz "$dest"/*.trace.json.gz
mkdir -p "$dest"
for entry in "${sample[@]}"; do
    name="${entry#v1:}"
    cp "$out/$name.jsonl.gz" "$dest/"
    if [[ "$entry" != v1:* ]]; then
        cp "$out/${name%-d[0-9]*}.trace.json.gz" "$dest/"
    fi
done
(cd "$repo/tests/fixtures" && python3 ../../scripts/v1-trace-truth.py --manifest \
    vllm-0.33.0-v1-corpus vllm-0.33.0-v1-reproducers >vllm-0.33.0-v1-corpus/truth.json)
echo "sample: $(ls "$dest" | grep -c '\.jsonl\.gz$') v1 traces, $(ls "$dest" | grep -c '\.trace\.json\.gz$') v2 in $dest"
