#!/usr/bin/env bash
# Wall-clock effect of lookup_threshold=0.6 on this CPU: `bench` at T=0, fp32, 1 thread, 64 new tokens, the first N
# prompts of a set in its own order. Methods in one run: plain generate(), run 29 (draft_vocab_context on) with the
# lookup, the same without it (dflash), and run 29's ReTrace drafter with the lookup (retrace_lookup).
#   bash results/context_lookup/bench_fp32.sh humaneval 64       (SHIP: results/ship29/prepare.sh's folder; TEMP=1: T=1)
set -euo pipefail
export OMP_NUM_THREADS=1
SET=$1; N=$2; SHIP=${SHIP:-/tmp/ship29}; LK=${LK:-/tmp/lk}; T=${T:-0.6}; TEMP=${TEMP:-0}
for kind in dflash retrace; do
  python results/context_lookup/with_lookup.py "$SHIP/smollm2-135m-instruct-$kind" "$LK/bench_${kind}_$SET" "$T"
done
dflash-retrace bench --target smollm2-135m-instruct --drafter "$LK/bench_dflash_$SET" \
  --compare "dflash=$SHIP/smollm2-135m-instruct-dflash" --compare "retrace_lookup=$LK/bench_retrace_$SET" \
  --dataset "$SET" --max-samples "$N" --source-order --max-new-tokens 64 --temperature "$TEMP" --dtype float32 \
  --output "results/context_lookup/bench_fp32_T${TEMP}_${SET}${N}.json" --no-progress > "results/context_lookup/bench_fp32_T${TEMP}_${SET}${N}.txt"
tail -n 40 "results/context_lookup/bench_fp32_T${TEMP}_${SET}${N}.txt"
