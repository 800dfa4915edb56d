#!/usr/bin/env bash
# run 7: from run 6's weights (the committed WIP checkpoint) on store2+store3a+store3b+store4 (5,460 of the target's
# own answers; data/smollm2-135m-instruct/README.md), bf16 autocast on a CPU with AMX, peak lr 2e-4 cosine.
set -eu  # run in a folder that holds the stores; INIT=<run 6's weights> when that is not this repository's root
export OMP_NUM_THREADS=1
dflash-retrace train --target smollm2-135m-instruct --features store2,store3a,store3b,store4 --eval-features heldout \
  --init ${INIT:-checkpoints/smollm2-135m-instruct-dflash-b8-wip} --out run7 --labels target-chain --mixed-precision bf16 \
  --max-steps ${STEPS:-2000} --grad-accum 4 --lr 2e-4 --warmup-ratio 0.03 --max-anchors 256 --eval-prompts 8 \
  --eval-max-new-tokens 64 --eval-every 100 --log-every 20 --checkpoint-every 50 --keep-checkpoints 2 \
  --save-dtype bfloat16 --seed 2 --no-progress "$@"
