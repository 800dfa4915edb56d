#!/usr/bin/env bash
# run 14 (issue 13): run 13's weights (the committed WIP checkpoint at the start of this session) continued on the
# first and fifth prompt mixes (10,289 of the target's own answers: mix4, answered two sessions ago and never trained
# on, and the first mix minus the 64 held-out rows, last trained on by run 8; stores s4 and s0 built as in
# results/wip_run13/README.md, "Stores for run 14"), run 8's recipe otherwise: bf16 stores and autocast, peak lr 2e-4
# cosine, 3% warm-up, 4 sequences per update, 256 anchors; seed 8 (a new data order).
set -eu  # run in the folder that holds the stores, with INIT=<run 13's weights>
export OMP_NUM_THREADS=${THREADS:-1}  # THREADS=2 when the other core is free
dflash-retrace train --target smollm2-135m-instruct --features s4,s0 --eval-features heldout \
  --init ${INIT:?INIT=run 13 folder} --out ${OUT:-run14} --labels target-chain \
  --mixed-precision bf16 --max-steps ${STEPS:-1900} --grad-accum 4 --lr 2e-4 --warmup-ratio 0.03 --max-anchors 256 \
  --eval-prompts 8 --eval-max-new-tokens 64 --eval-every 350 --log-every 20 --checkpoint-every 50 \
  --keep-checkpoints 2 --save-dtype bfloat16 --seed 8 --no-progress "$@"
