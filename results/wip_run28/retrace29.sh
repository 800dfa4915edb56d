#!/usr/bin/env bash
# ReTrace stage on run 29 (the ship candidate), with its context tokens in its draft vocabulary
# (`draft_vocab_context`, results/context_vocab/; the shipped pair will carry it on): the same command as
# results/ship24's stage with INIT=run 29 (a copy with the option on). Its rollouts are one file per row, reused on
# --resume (append it to continue an interrupted stage). Needs a CPU with bf16 matrix units (AMX): on an AVX2-only
# CPU the bf16 rollouts ran at 40 s a row instead of 8.
set -eu
export PATH=/work/main/.venv/bin:$PATH
cd /work/main
INIT=${INIT:-/tmp/run29ctx}
[ -f "$INIT/model.safetensors" ] || python results/context_vocab/with_context.py results/wip_run28/run29 "$INIT"
SOURCE=regen-mix10-part00 ROWS=608 INIT="$INIT" OUT=${OUT:-/work/run29/retrace29} \
  bash results/ship13/retrace11.sh --freeze-backbone --max-steps 300 "$@"
echo "$(date +%T) RETRACE29_DONE"
