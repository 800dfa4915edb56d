#!/usr/bin/env bash
# Selection benches of results/retrace_sampled/README.md, from the repository root, one core per call:
#   MIXED=retrace20s GREEDY=retrace20 DFLASH=run20 OUT=results/retrace_sampled/bench \
#     bash results/retrace_sampled/select.sh 1 /work/run17/heldout.jsonl first
# (T, held-out rows, name). bf16, 1 thread, 64 new tokens, the 64 rows in their own order.
set -euo pipefail
export OMP_NUM_THREADS=1
mkdir -p "$OUT"
dflash-retrace bench --target smollm2-135m-instruct --drafter "${MIXED:?}" --compare greedy="${GREEDY:?}" \
  --compare dflash="${DFLASH:?}" --dataset "$2" --max-samples 64 --source-order --max-new-tokens 64 \
  --temperature "$1" --dtype bfloat16 --output "$OUT/T$1_$3.json" --no-progress > "$OUT/T$1_$3.txt"
