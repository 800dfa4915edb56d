#!/usr/bin/env bash
# Issue 13's must-show runs for the shipped SmolLM2 drafters, bf16, 1 thread, 64 new tokens per turn, full sets in
# their own order (HumanEval 164, MT-Bench 80 x 2 turns, GSM8K first 128), from the repository root:
#   bash results/ship13/bench.sh T0 humaneval     # one `bench` run: plain, ReTrace, DFlash (--compare) and, at T=0,
#                                                  # ReTrace with its memory off, all against the same plain run
#   bash results/ship13/bench.sh baselines        # HumanEval's first 40: our generator against z-lab's loop and
#                                                  # transformers' built-in DFlash path, same weights (full head)
set -euo pipefail
export OMP_NUM_THREADS=1
OUT=${OUT:-results/ship13/bench}
mkdir -p "$OUT"
if [ "$1" = "baselines" ]; then
  FULL=${FULL:-/tmp/dflash-full-head}
  [ -f "$FULL/model.safetensors" ] || python results/ship13/full_head.py hub_configs/smollm2-135m-instruct-dflash "$FULL"
  dflash-retrace bench --target smollm2-135m-instruct --drafter "$FULL" --baselines \
    --compare draft-vocab=hub_configs/smollm2-135m-instruct-dflash --dataset humaneval --max-samples 40 --source-order \
    --max-new-tokens 64 --temperature 0 --dtype bfloat16 --output "$OUT/baselines_humaneval40.json" --no-progress \
    > "$OUT/baselines_humaneval40.txt"
  tail -n 40 "$OUT/baselines_humaneval40.txt"
else
  T=${1#T}
  DATASETS="$2" DFLASH_BENCH_ARGS="--dtype bfloat16" bash examples/bench_shipped.sh "$T" "$OUT"
fi
