#!/usr/bin/env bash
# Held-out selection check of run 11 against the committed checkpoint (run 8): exact fp32 replay of the 64 held-out
# prompts (data/smollm2-135m-instruct/held-out-ids.json), 64 new tokens, on cached plain outputs (REFS; written on the
# first run if missing).
#   HELDOUT=heldout.jsonl REFS=refs.jsonl RUN11=run11 bash results/wip_run11/replay.sh
set -eu
export OMP_NUM_THREADS=1
dflash-retrace replay --target smollm2-135m-instruct --drafter ${RUN8:-hub_configs/smollm2-135m-instruct-dflash} \
  --compare run11=${RUN11} --dataset ${HELDOUT} --max-samples 64 --source-order \
  --max-new-tokens 64 --dtype float32 --references ${REFS} --seed 4 --no-progress \
  --output ${OUTPUT:-results/wip_run11/replay_heldout64_run8_vs_run11.json}
