#!/usr/bin/env bash
# run 29: run 28's v16k arm (16,384 ids) continued at peak lr 1e-4 (run 28's lr1 finding) on run 26's rows
# (stores s15a, s15b, sm9: seen by run 26 with the 8,192-id vocabulary), 1,200 updates (of 1,457 for a full pass),
# seed 29, one thread
set -eu
export PATH=/work/main/.venv/bin:$PATH
cd /work/run27
INIT=/work/run28/v16k OUT=/work/run28/run29 STEPS=1200 THREADS=1 \
  bash /work/main/results/wip_run14/run14.sh --features /work/run26/s15a,/work/run26/s15b,/work/run23/sm9 --seed 29 --lr 1e-4
echo "$(date +%T) RUN29_DONE"
