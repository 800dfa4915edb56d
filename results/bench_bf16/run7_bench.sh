#!/usr/bin/env bash
# HumanEval 164, bf16, 1 thread, 64 new tokens, greedy: the WIP drafter (run 7) against plain generate() in one run.
# Run from the repository root.
set -eu
export OMP_NUM_THREADS=1
dflash-retrace bench --target smollm2-135m-instruct --drafter checkpoints/smollm2-135m-instruct-dflash-b8-wip \
  --dataset humaneval --max-samples 164 --source-order --max-new-tokens 64 --dtype bfloat16 \
  --output results/bench_bf16/run7_humaneval164_bf16.json --no-progress
