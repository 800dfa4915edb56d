#!/usr/bin/env bash
# run 12 (issue 13): run 11's weights (the committed WIP checkpoint) continued on the second and third prompt mixes
# together (7,411 of the target's own answers: mix1, last trained on by run 8, and mix2, run 11's data; stores s1a,
# s1b, s2a, s2b built as in results/wip_run12/README.md), run 8's recipe otherwise: bf16 stores and autocast, peak lr
# 2e-4 cosine, 3% warm-up, 4 sequences per update, 256 anchors; seed 6 (a new data order).
set -eu  # run in the folder that holds the stores, with INIT=<run 11's weights> (README.md here: git archive ace0236)
export OMP_NUM_THREADS=1
dflash-retrace train --target smollm2-135m-instruct --features s1a,s1b,s2a,s2b --eval-features heldout \
  --init ${INIT:?INIT=run 11 folder} --out ${OUT:-run12} --labels target-chain \
  --mixed-precision bf16 --max-steps ${STEPS:-2100} --grad-accum 4 --lr 2e-4 --warmup-ratio 0.03 --max-anchors 256 \
  --eval-prompts 8 --eval-max-new-tokens 64 --eval-every 525 --log-every 20 --checkpoint-every 50 \
  --keep-checkpoints 2 --save-dtype bfloat16 --seed 6 --no-progress "$@"
