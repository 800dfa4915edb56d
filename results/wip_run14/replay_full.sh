#!/usr/bin/env bash
# The evaluation sets, after selection (never used to select): exact fp32 greedy replay of run 14 against run 13,
# 64 new tokens per turn, on the cached plain outputs of the full sets. About 8 minutes for the three on one core.
#   RUN13=run13_init RUN14=run14 bash results/wip_run14/replay_full.sh
set -eu
export OMP_NUM_THREADS=1
for s in humaneval:164 gsm8k:128 mt-bench:80; do
  dflash-retrace replay --target smollm2-135m-instruct --drafter ${RUN13:?RUN13=run 13 folder} \
    --compare run14=${RUN14:?RUN14=run 14 folder} --dataset ${s%%:*} --max-samples ${s##*:} --source-order \
    --max-new-tokens 64 --dtype float32 \
    --references results/replay_full/references_smollm2-135m-instruct_fp32_64.jsonl \
    --output results/wip_run14/replay_run13_vs_run14_${s%%:*}${s##*:}.json --no-progress
done
