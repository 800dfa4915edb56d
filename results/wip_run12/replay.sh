#!/usr/bin/env bash
# Held-out selection check of run 12 against run 11 (the checkpoint it started from) and run 8 (the shipped DFlash
# drafter): exact fp32 replay of the 64 held-out prompts (data/smollm2-135m-instruct/held-out-ids.json), 64 new
# tokens, on cached plain outputs (REFS; written on the first run if missing).
#   HELDOUT=heldout.jsonl REFS=refs.jsonl RUN11=run11_init RUN12=run12 bash results/wip_run12/replay.sh
set -eu
export OMP_NUM_THREADS=1
dflash-retrace replay --target smollm2-135m-instruct --drafter ${RUN11:?RUN11=run 11 folder} \
  --compare run12=${RUN12} --compare run8=${RUN8:-hub_configs/smollm2-135m-instruct-dflash} --dataset ${HELDOUT} \
  --max-samples 64 --source-order --max-new-tokens 64 --dtype float32 --references ${REFS} --seed 4 --no-progress \
  --output ${OUTPUT:-results/wip_run12/replay_heldout64_run11_vs_run12.json}
