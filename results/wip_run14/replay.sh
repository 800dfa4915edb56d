#!/usr/bin/env bash
# Held-out selection check of run 14 against run 13 (the checkpoint it started from) and run 8 (the shipped DFlash
# drafter): exact fp32 replay of the 64 held-out prompts (data/smollm2-135m-instruct/held-out-ids.json), 64 new
# tokens, on cached plain outputs (REFS; written on the first run if missing).
#   HELDOUT=heldout.jsonl REFS=refs.jsonl RUN13=run13_init RUN14=run14 bash results/wip_run14/replay.sh
set -eu
export OMP_NUM_THREADS=1
dflash-retrace replay --target smollm2-135m-instruct --drafter ${RUN13:?RUN13=run 13 folder} \
  --compare run14=${RUN14:?RUN14=run 14 folder} --compare run8=${RUN8:-hub_configs/smollm2-135m-instruct-dflash} \
  --dataset ${HELDOUT:?HELDOUT=the 64 held-out rows} --max-samples 64 --source-order --max-new-tokens 64 \
  --dtype float32 --references ${REFS:?REFS=cached plain outputs} --seed 4 --no-progress \
  --output ${OUTPUT:-results/wip_run14/replay_heldout64_run13_vs_run14.json}
