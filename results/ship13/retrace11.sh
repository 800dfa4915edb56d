#!/usr/bin/env bash
# The shipped ReTrace drafter (issue 13): the ReTrace stage from the DFlash drafter (the WIP lineage's run 8) on 248
# answers of the third prompt mix (data/smollm2-135m-instruct/regen-mix2-part00.jsonl.gz, which runs 1-8 never trained
# on; shuffled with seed 11, the first 248). Every prompt is rolled out once with run 8 (greedy, bf16 target, one core),
# then 500 updates of 2 sequences replay its rounds with the memory they received; the option's zero-initialised
# weights train at 10x the backbone's lr. Run from the repository root; OUT=<folder>, INIT=<DFlash backbone> (default:
# the WIP checkpoint), SOURCE=<answers file in data/smollm2-135m-instruct, without .jsonl.gz> (default:
# regen-mix2-part00; run 15's stage used regen-mix6-part00, which no DFlash run had trained on then; run 16 trains on it),
# ROWS=<how many of the shuffled answers> (default 248; run 18's stage, results/ship18/, takes 608 with --freeze-backbone).
set -eu
export OMP_NUM_THREADS=1
OUT=${OUT:-retrace11}
DATA=${DATA:-$OUT.data.jsonl}
[ -f "$DATA" ] || gunzip -c data/smollm2-135m-instruct/${SOURCE:-regen-mix2-part00}.jsonl.gz | python -c "
import random, sys
rows = sys.stdin.readlines(); random.Random(11).shuffle(rows); sys.stdout.writelines(rows[:${ROWS:-248}])" > "$DATA"
dflash-retrace train --stage retrace --init ${INIT:-checkpoints/smollm2-135m-instruct-dflash-b8-wip} \
  --target smollm2-135m-instruct --dtype bfloat16 --data "$DATA" --out "$OUT" \
  --max-length 640 --max-anchors 128 --max-steps 500 --grad-accum 2 --lr 5e-5 --new-weights-lr-scale 10 \
  --beta-warmup 50 --mixed-precision bf16 --eval-size 8 --eval-prompts 8 --eval-max-new-tokens 64 \
  --checkpoint-every 50 --keep-checkpoints 2 --log-every 10 --save-dtype bfloat16 --seed 11 --no-progress "$@"
