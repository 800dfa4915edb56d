#!/usr/bin/env bash
# ReTrace stage on run 29 (the ship candidate): the same command as results/ship24's stage with INIT=run 29; its
# rollouts are one file per row, reused on --resume (append it to continue an interrupted stage).
set -eu
export PATH=/work/main/.venv/bin:$PATH
cd /work/main
SOURCE=regen-mix10-part00 ROWS=608 INIT=results/wip_run28/run29 OUT=${OUT:-/work/run29/retrace29} \
  bash results/ship13/retrace11.sh --freeze-backbone --max-steps 300 "$@"
echo "$(date +%T) RETRACE29_DONE"
