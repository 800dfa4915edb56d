#!/usr/bin/env bash
# Full-set greedy replays (issue 13's sets, 64 new tokens per turn, fp32, 1 thread), run from the repository root.
# The plain generate() outputs they replay on are cached in references_smollm2-135m-instruct_fp32_64.jsonl (452 turns;
# evaluation-set outputs of the target: never train on them); with it a replay of another drafter takes minutes.
# DRAFTER=... COMPARE="label=folder ..." OUT=... override the drafters (this run: the committed WIP checkpoint, run 4,
# against run 5's weights).
set -eu
export OMP_NUM_THREADS=1
DRAFTER=${DRAFTER:-checkpoints/smollm2-135m-instruct-dflash-b8-wip}
COMPARE=${COMPARE:-run5=results/wip_run5/weights}
OUT=${OUT:-results/replay_full/run4}
compare=(); for c in $COMPARE; do compare+=(--compare "$c"); done
for spec in humaneval:164 gsm8k:128 mt-bench:80; do
  set_=${spec%%:*}; n=${spec##*:}
  dflash-retrace replay --target smollm2-135m-instruct --drafter "$DRAFTER" "${compare[@]}" \
    --dataset "$set_" --max-samples "$n" --source-order --max-new-tokens 64 --dtype float32 \
    --references results/replay_full/references_smollm2-135m-instruct_fp32_64.jsonl \
    --output "${OUT}_${set_}${n}.json" --no-progress
done
