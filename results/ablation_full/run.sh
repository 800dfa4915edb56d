#!/usr/bin/env bash
# Issue 15's ablation on the SmolLM2 target: every variant trained from the WIP DFlash drafter (run 8's weights,
# git commit 834f321) for 300 updates of 4 sequences on the same store (the 3,609 answers of the third prompt mix,
# data/smollm2-135m-instruct/regen-mix2-part00.jsonl.gz, which no earlier run trained on), seed 4, peak lr 2e-4
# cosine, the option modules' zero-initialised weights at 10x that lr; then T=0 on the full sets (exact fp32 replay)
# and T=1 (bf16 bench, one run per set). Stores (results/ablation_full/README.md):
#   s6a, s6b: the two halves of that file; heldout: the 64 held-out rows; layers 1,5,8,9,13,14,17,20,21,25,27,29
#   (DFlash's six, DFlare's broad set 1,5,...,29, and 20 / 27 from which KV layers 21 / 28 are recomputed).
# Run from the repository root with STORES=<folder holding s6a, s6b, heldout> OUT=<output folder>. The T=1 cells
# run on the full sets by default; SAMPLE=humaneval:32,mt-bench:16,gsm8k:32 gives the first-prompts run, TEMPS=1
# only the T=1 cells, JOBS the processes at a time (one core each).
set -eu
S=${STORES:?folder with s6a, s6b and heldout}
python examples/ablation_variants.py --target smollm2-135m-instruct --features "$S/s6a,$S/s6b" \
  --init ${INIT:-checkpoints/smollm2-135m-instruct-dflash-b8-wip} --out ${OUT:?output folder} --steps 300 --seed 4 \
  --jobs ${JOBS:-2} --fusion-layer-ids 1,5,9,13,17,21,25,29 --kv-layer-ids 21,28 --replay \
  --datasets humaneval:164,mt-bench:80,gsm8k:128 --sample-datasets ${SAMPLE:-humaneval:164,mt-bench:80,gsm8k:128} \
  --temperatures ${TEMPS:-0,1} --max-new-tokens 64 --dtype bfloat16 \
  --train-args "--eval-features $S/heldout --labels target-chain --mixed-precision bf16 --grad-accum 4 --lr 2e-4 \
--warmup-ratio 0.03 --max-anchors 256 --eval-prompts 0 --eval-every 100 --log-every 20 --checkpoint-every 50 \
--keep-checkpoints 1 --save-dtype bfloat16 --no-progress --new-weights-lr-scale 10"
