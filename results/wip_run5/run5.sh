#!/usr/bin/env bash
# run 5: from run 4's weights on store3a (1,197 new answers: rows 641-1626 of part01 + 1-211 of part02), held-out fixed
set -eu
export OMP_NUM_THREADS=1
/work/main/.venv/bin/dflash-retrace train --target smollm2-135m-instruct --features store3a --eval-features heldout \
  --init /work/main/checkpoints/smollm2-135m-instruct-dflash-b8-wip --out run5 --labels target-chain \
  --max-steps 200 --grad-accum 4 --lr 3e-4 --warmup-ratio 0.03 --max-anchors 256 --eval-prompts 8 \
  --eval-max-new-tokens 64 --eval-every 25 --log-every 10 --checkpoint-every 25 --keep-checkpoints 2 \
  --save-dtype bfloat16 --seed 0 --no-progress
# Run 5's final weights (bf16, weights only) are committed in results/wip_run5/weights/. To continue from them
# (e.g. on store3b, at a lower peak lr as the checkpoint README suggests):
#   dflash-retrace train --target smollm2-135m-instruct --features store3b --eval-features heldout \
#     --init results/wip_run5/weights --out run6 --labels target-chain --max-steps 300 --grad-accum 4 --lr 1e-4 \
#     --warmup-ratio 0.03 --max-anchors 256 --eval-prompts 8 --eval-max-new-tokens 64 --eval-every 25 \
#     --log-every 10 --checkpoint-every 25 --keep-checkpoints 2 --save-dtype bfloat16 --seed 0
