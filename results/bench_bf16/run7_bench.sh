#!/usr/bin/env bash
# HumanEval 164, bf16, 1 thread, 64 new tokens, greedy: run 7 against plain generate() in one run
set -eu
export OMP_NUM_THREADS=1 PATH=/work/main/.venv/bin:$PATH
dflash-retrace bench --target smollm2-135m-instruct --drafter run7 --dataset humaneval --max-samples 164 \
  --source-order --max-new-tokens 64 --dtype bfloat16 --output bench_run7_humaneval164_bf16.json --no-progress
