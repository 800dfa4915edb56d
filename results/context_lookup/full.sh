#!/usr/bin/env bash
# Evaluation of lookup_threshold=0.6 (chosen on the held-out splits: heldout.sh) on one of issue 13's sets: exact fp32
# replay, 64 new tokens per turn, 1 thread, on the cached plain outputs of results/replay_full/. Drafters: the shipped
# DFlash drafter (run 24, as shipped) and run 29 with draft_vocab_context on (results/ship29/prepare.sh), each with
# and without the lookup (config copies; the same weight files).
#   bash results/context_lookup/full.sh humaneval 164      (and gsm8k 128, mt-bench 80)
set -euo pipefail
export OMP_NUM_THREADS=1
SET=$1; N=$2; SHIP=${SHIP:-/tmp/ship29}; LK=${LK:-/tmp/lk}; T=${T:-0.6}
python results/context_lookup/with_lookup.py hub_configs/smollm2-135m-instruct-dflash "$LK/run24_$SET" "$T"
python results/context_lookup/with_lookup.py "$SHIP/smollm2-135m-instruct-dflash" "$LK/run29_$SET" "$T"
dflash-retrace replay --target smollm2-135m-instruct --drafter "$SHIP/smollm2-135m-instruct-dflash" \
  --compare "run29lookup=$LK/run29_$SET" --compare "run24=hub_configs/smollm2-135m-instruct-dflash" \
  --compare "run24lookup=$LK/run24_$SET" \
  --dataset "$SET" --max-samples "$N" --source-order --max-new-tokens 64 --dtype float32 \
  --references results/replay_full/references_smollm2-135m-instruct_fp32_64.jsonl \
  --output "results/context_lookup/replay_${SET}${N}.json" --no-progress
python -c "import json,sys; from dflash_retrace.evaluation.replay import format_replay; print(format_replay(json.load(open(sys.argv[1]))))" \
  "results/context_lookup/replay_${SET}${N}.json"
