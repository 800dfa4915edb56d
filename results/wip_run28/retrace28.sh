#!/usr/bin/env bash
# ReTrace stage on v16k (run 28), banked: its rollouts (one file per row, reused on --resume) start now; the same
# command as results/ship24's stage with INIT=v16k. Next session: the same line with --resume appended.
set -eu
export PATH=/work/main/.venv/bin:$PATH
cd /work/main
SOURCE=regen-mix10-part00 ROWS=608 INIT=results/wip_run28/v16k OUT=/work/run28/retrace28 \
  bash results/ship13/retrace11.sh --freeze-backbone --max-steps 300 "$@"
echo "$(date +%T) RETRACE28_DONE"
