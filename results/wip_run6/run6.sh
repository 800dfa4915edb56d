#!/usr/bin/env bash
# run 6: from run 4's weights (the committed WIP checkpoint) on store2+store3a, peak lr 1e-4 (run 5's 3e-4 re-warm dipped)
set -eu
export OMP_NUM_THREADS=1
dflash-retrace train --target smollm2-135m-instruct --features store2,store3a --eval-features heldout \
  --init checkpoints/smollm2-135m-instruct-dflash-b8-wip --out run6 --labels target-chain \
  --max-steps 400 --grad-accum 4 --lr 1e-4 --warmup-ratio 0.03 --max-anchors 256 --eval-prompts 8 \
  --eval-max-new-tokens 64 --eval-every 50 --log-every 10 --checkpoint-every 25 --keep-checkpoints 2 \
  --save-dtype bfloat16 --seed 1 --no-progress
