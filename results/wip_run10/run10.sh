#!/usr/bin/env bash
# run 10: does a fresh drafter learn faster when its decoder layers start as copies of the target's top layers?
# Two fresh 4-layer drafters (SmolLM2 width 576, block 8, target layers 1,8,14,20,27,29, draft vocabulary 8,192),
# identical but for --init-layers (target-top: drafter layers 0-3 = target layers 26-29; random), trained on the same
# bf16 stores s6a+s6b (3,609 of the target's own answers of the third prompt mix; results/ablation_full/README.md),
# same seed, data order and schedule, evaluated on the held-out store every 100 updates.
#   INIT_LAYERS=target-top OUT=run10-top bash run10.sh
#   INIT_LAYERS=random     OUT=run10-rand bash run10.sh
set -eu  # run in a folder that holds the stores s6a, s6b and heldout
export OMP_NUM_THREADS=1
dflash-retrace train --target smollm2-135m-instruct --features s6a,s6b --eval-features heldout \
  --out ${OUT} --num-layers ${LAYERS:-4} --block-size 8 --target-layer-ids 1,8,14,20,27,29 \
  --init-layers ${INIT_LAYERS} --draft-vocab-size 8192 --labels target-chain \
  --mixed-precision bf16 --max-steps ${STEPS:-1500} --grad-accum 4 --lr ${LR:-6e-4} --warmup-ratio 0.03 \
  --max-anchors 256 --eval-prompts 0 --eval-every 100 --log-every 20 --checkpoint-every 100 \
  --keep-checkpoints 2 --save-dtype bfloat16 --seed 0 --no-progress "$@"
