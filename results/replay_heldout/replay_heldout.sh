#!/usr/bin/env bash
# Held-out selection replay of the WIP lineage (issue 13), run from the repository root: exact fp32 greedy replay of
# the 64 held-out prompts (data/smollm2-135m-instruct/held-out-ids.json), 64 new tokens, on cached plain outputs
# (REFS; written on the first run if missing). DRAFTER is the report's `main`, COMPARE="label=folder ..." the others.
#   HELDOUT=heldout.jsonl REFS=refs.jsonl DRAFTER=run13_init COMPARE="run14=run14 run8=hub_configs/smollm2-135m-instruct-dflash" \
#     OUTPUT=results/wip_run14/replay_heldout64_run13_vs_run14.json bash results/replay_heldout/replay_heldout.sh
set -eu
export OMP_NUM_THREADS=1
compare=(); for c in ${COMPARE:?COMPARE=\"label=folder ...\"}; do compare+=(--compare "$c"); done
dflash-retrace replay --target smollm2-135m-instruct --drafter "${DRAFTER:?DRAFTER=the baseline folder}" "${compare[@]}" \
  --dataset "${HELDOUT:?HELDOUT=the 64 held-out rows}" --max-samples 64 --source-order --max-new-tokens 64 \
  --dtype float32 --references "${REFS:?REFS=cached plain outputs}" --seed 4 --no-progress \
  --output "${OUTPUT:?OUTPUT=report.json}"
