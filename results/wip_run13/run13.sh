#!/usr/bin/env bash
# run 13 (issue 13): run 12's weights (the committed WIP checkpoint at the start of this session) continued on the
# second, third and fourth prompt mixes together (11,769 of the target's own answers: mix1 and mix2, run 12's data, and
# mix3, answered last session and never trained on; stores s1a, s1b, s2a, s2b, s3a, s3b built as in README.md here),
# run 8's recipe otherwise: bf16 stores and autocast, peak lr 2e-4 cosine, 3% warm-up, 4 sequences per update,
# 256 anchors; seed 7 (a new data order).
set -eu  # run in the folder that holds the stores, with INIT=<run 12's weights>
export OMP_NUM_THREADS=1
dflash-retrace train --target smollm2-135m-instruct --features s1a,s1b,s2a,s2b,s3a,s3b --eval-features heldout \
  --init ${INIT:?INIT=run 12 folder} --out ${OUT:-run13} --labels target-chain \
  --mixed-precision bf16 --max-steps ${STEPS:-2100} --grad-accum 4 --lr 2e-4 --warmup-ratio 0.03 --max-anchors 256 \
  --eval-prompts 8 --eval-max-new-tokens 64 --eval-every 350 --log-every 20 --checkpoint-every 50 \
  --keep-checkpoints 2 --save-dtype bfloat16 --seed 7 --no-progress "$@"
