#!/usr/bin/env bash
# τ of the ReTrace stage against its DFlash backbone measured live (ReTrace memory needs the verify forward, so
# `replay` cannot measure it): `bench` at T=0, fp32, 1 thread, 64 new tokens, the first N prompts of one set in its
# own order; plain generate(), the ReTrace drafter and the DFlash drafter (--compare) in one run. fp32 because this
# session's CPU (AMD EPYC, AVX2 only) has no bf16 matrix units: the times are fp32 times on that CPU, the τ exact.
#   bash results/ship29/bench_fp32.sh humaneval 64        (SHIP=<folder of results/ship29/prepare.sh>, default /tmp/ship29)
set -euo pipefail
export OMP_NUM_THREADS=1
SET=$1; N=$2; SHIP=${SHIP:-/tmp/ship29}
dflash-retrace bench --target smollm2-135m-instruct --drafter "$SHIP/smollm2-135m-instruct-retrace" \
  --compare "dflash=$SHIP/smollm2-135m-instruct-dflash" --dataset "$SET" --max-samples "$N" --source-order \
  --max-new-tokens 64 --temperature 0 --dtype float32 --output "results/ship29/bench_fp32_T0_${SET}${N}.json" \
  --no-progress > "results/ship29/bench_fp32_T0_${SET}${N}.txt"
tail -n 40 "results/ship29/bench_fp32_T0_${SET}${N}.txt"
