#!/usr/bin/env bash
# run 8: from run 7's weights (the committed WIP checkpoint) on store3b+store4+store5 (6,915 of the target's own
# answers: 3,113 of the first prompt mix and all 3,802 of the second; data/smollm2-135m-instruct/README.md), bf16
# stores and bf16 autocast on a CPU with bf16 matrix units (AVX512-BF16 here), peak lr 2e-4 cosine, 1,500 updates.
# Run 8d, the same with a third decoder layer (run 7 plus one layer whose output projections are zero, so it starts
# as run 7 exactly; results/wip_run8/deepen.py): INIT=run7_deep3 OUT=run8d bash run8.sh
set -eu  # run in a folder that holds the stores; INIT=<run 7's weights> when that is not this repository's root
export OMP_NUM_THREADS=1
dflash-retrace train --target smollm2-135m-instruct --features store3b,store4,store5 --eval-features heldout \
  --init ${INIT:-checkpoints/smollm2-135m-instruct-dflash-b8-wip} --out ${OUT:-run8} --labels target-chain \
  --mixed-precision bf16 --max-steps ${STEPS:-1500} --grad-accum 4 --lr 2e-4 --warmup-ratio 0.03 --max-anchors 256 \
  --eval-prompts 8 --eval-max-new-tokens 64 --eval-every 100 --log-every 20 --checkpoint-every 50 \
  --keep-checkpoints 2 --save-dtype bfloat16 --seed 3 --no-progress "$@"
