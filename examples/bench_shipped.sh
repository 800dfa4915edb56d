#!/usr/bin/env bash
# Benchmarks the shipped SmolLM2-135M-Instruct drafters: for one temperature, HumanEval, MT-Bench and GSM8K, each in
# one `dflash-retrace bench` run that times the ReTrace drafter, the DFlash drafter (--compare) and, at T=0, the
# ReTrace drafter with its memory off (--no-memory-ablation) against the same plain generate() run.
#
#   bash examples/bench_shipped.sh 0 results/shipped                 # full sets: 164 / 80 / first 128 prompts
#   N_HUMANEVAL=40 N_MTBENCH=16 N_GSM8K=40 SHUFFLE=1 bash examples/bench_shipped.sh 1 results/shipped  # seeded subsets
#   python examples/bench_table.py results/shipped/*.json
#
# Env: MAX_NEW_TOKENS (default 64); N_HUMANEVAL / N_MTBENCH / N_GSM8K (default 164 / 80 / 128); DATASETS (default
# "humaneval mt-bench gsm8k": run a subset, e.g. to spread the six runs over cores); SHUFFLE=1 takes the first N
# after the seeded shuffle instead of the sets' own order (the default, so GSM8K is its first 128);
# DFLASH_BENCH_ARGS (more bench flags).
set -euo pipefail
T="${1:?usage: bench_shipped.sh TEMPERATURE OUT_DIR}"
OUT="${2:?usage: bench_shipped.sh TEMPERATURE OUT_DIR}"
HERE="$(cd "$(dirname "$0")/.." && pwd)"
RETRACE="$HERE/hub_configs/smollm2-135m-instruct-retrace"
DFLASH="$HERE/hub_configs/smollm2-135m-instruct-dflash"
mkdir -p "$OUT"
EXTRA=()
if [ "$T" = "0" ]; then EXTRA+=(--no-memory-ablation); fi
if [ "${SHUFFLE:-0}" = "0" ]; then EXTRA+=(--source-order); fi
declare -A N=([humaneval]="${N_HUMANEVAL:-164}" [mt-bench]="${N_MTBENCH:-80}" [gsm8k]="${N_GSM8K:-128}")
for dataset in ${DATASETS:-humaneval mt-bench gsm8k}; do
  n="${N[$dataset]:?unknown dataset $dataset (humaneval, mt-bench, gsm8k)}"
  name="T${T}_${dataset}"
  echo "$(date +%T) $name n=$n"
  dflash-retrace bench --target smollm2-135m-instruct --drafter "$RETRACE" --compare "dflash=$DFLASH" \
    "${EXTRA[@]}" --dataset "$dataset" --max-samples "$n" --max-new-tokens "${MAX_NEW_TOKENS:-64}" \
    --temperature "$T" --output "$OUT/$name.json" --plot "$OUT/$name.png" --no-progress ${DFLASH_BENCH_ARGS:-} \
    > "$OUT/$name.txt"
  tail -n 30 "$OUT/$name.txt"
done
echo "$(date +%T) done"
