#!/usr/bin/env bash
# run 11 (issue 13): does the committed lineage still climb? From run 8's weights (the committed WIP checkpoint) on
# the third prompt mix (3,609 of the target's own answers that run 8 never saw; stores s2a, s2b built as in
# results/wip_run11/README.md), run 8's recipe otherwise: bf16 stores and autocast, peak lr 2e-4 cosine, 3% warm-up,
# 4 sequences per update, 256 anchors, seed 5. 1,300 updates (about 6M supervised slot-tokens).
set -eu  # run in the folder that holds the stores; INIT=<run 8, the shipped DFlash drafter> when that is not this repository's root
export OMP_NUM_THREADS=1
dflash-retrace train --target smollm2-135m-instruct --features s2a,s2b --eval-features heldout \
  --init ${INIT:-hub_configs/smollm2-135m-instruct-dflash} --out ${OUT:-run11} --labels target-chain \
  --mixed-precision bf16 --max-steps ${STEPS:-1300} --grad-accum 4 --lr 2e-4 --warmup-ratio 0.03 --max-anchors 256 \
  --eval-prompts 8 --eval-max-new-tokens 64 --eval-every 325 --log-every 20 --checkpoint-every 50 \
  --keep-checkpoints 2 --save-dtype bfloat16 --seed 5 --no-progress "$@"
