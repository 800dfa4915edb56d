#!/usr/bin/env bash
# Issue 13's per-round overhead runs (results/loop_overhead/), from the repository root, 1 thread per run:
#   bash results/loop_overhead/run.sh tiny          # examples/loop_overhead.py on tiny random models (fp32)
#   bash results/loop_overhead/run.sh split         # the same split on SmolLM2 + the shipped DFlash weights (bf16)
#   bash results/loop_overhead/run.sh humaneval40 after                            # `bench --baselines`, bf16, T=0
#   PYTHONPATH=<worktree of b4be459>/src bash results/loop_overhead/run.sh humaneval40 before   # the code before
#   bash results/loop_overhead/run.sh humaneval164 | gsm8k64 | humaneval40_t1
# The baselines run on the DFlash weights with the target's full head (z-lab's loop has no draft vocabulary).
set -euo pipefail
export OMP_NUM_THREADS=1
OUT=results/loop_overhead
FULL=${FULL:-/tmp/dflash-full-head}
[ -f "$FULL/model.safetensors" ] || python results/ship13/full_head.py hub_configs/smollm2-135m-instruct-dflash "$FULL"
baselines() {  # NAME DATASET N [extra bench args]
  local name=$1 dataset=$2 n=$3; shift 3
  dflash-retrace bench --target smollm2-135m-instruct --drafter "$FULL" --baselines --dataset "$dataset" \
    --max-samples "$n" --source-order --max-new-tokens 64 --temperature 0 --dtype bfloat16 "$@" \
    --output "$OUT/baselines_${name}_bf16.json" --no-progress > "$OUT/baselines_${name}_bf16.txt" 2>&1
  grep -E "^(plain|speculative|zlab|transformers)|overhead" "$OUT/baselines_${name}_bf16.txt"
}
case "$1" in
  tiny) python examples/loop_overhead.py --output "$OUT/tiny_${2:-after}.json" | tee "$OUT/tiny_${2:-after}.txt" ;;
  split) python examples/loop_overhead.py --target smollm2-135m-instruct --drafter "$FULL" --dtype bfloat16 \
           --prompts 6 --max-new-tokens 64 --output "$OUT/smollm2_bf16.json" | tee "$OUT/smollm2_bf16.txt" ;;
  humaneval40) baselines "humaneval40_${2:-after}" humaneval 40 \
                 --compare draft-vocab=hub_configs/smollm2-135m-instruct-dflash ;;
  humaneval164) baselines humaneval164 humaneval 164 ;;
  gsm8k64) baselines gsm8k64 gsm8k 64 ;;
  humaneval40_t1) baselines humaneval40_t1 humaneval 40 --temperature 1 ;;  # sampling: logits to transformers
  *) echo "usage: $0 tiny|split|humaneval40 [before|after]|humaneval164|gsm8k64|humaneval40_t1" >&2; exit 2 ;;
esac
