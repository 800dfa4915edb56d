#!/usr/bin/env bash
# run 29's selection replays: the three held-out splits, v16k (its init, the lineage head) against run 29
set -eu
cd /work/main
export PATH=/work/main/.venv/bin:$PATH
R=/work/run23; O=results/wip_run28
W=results/wip_run28/v16k
C="run29=/work/run28/run29"
HELDOUT=$R/heldout_solve.jsonl REFS=$R/refs_solve.jsonl DRAFTER=$W COMPARE="$C" OUTPUT=$O/replay_heldout_solve64_run29_vs_v16k.json bash results/replay_heldout/replay_heldout.sh > /work/run28/r29_solve.log 2>&1 &
HELDOUT=$R/heldout.jsonl REFS=$R/refs.jsonl DRAFTER=$W COMPARE="$C" OUTPUT=$O/replay_heldout64_run29_vs_v16k.json bash results/replay_heldout/replay_heldout.sh > /work/run28/r29_first.log 2>&1
wait
HELDOUT=$R/heldout_math.jsonl REFS=$R/refs_math.jsonl DRAFTER=$W COMPARE="$C" OUTPUT=$O/replay_heldout_math64_run29_vs_v16k.json bash results/replay_heldout/replay_heldout.sh > /work/run28/r29_math.log 2>&1
echo "$(date +%T) REPLAYS29_DONE"
