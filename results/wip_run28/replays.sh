#!/usr/bin/env bash
# run 28's selection replays (results/wip_run28/README.md): the three held-out splits, run 26 against the control
# (run27), both arms and run 26 with 16,384 ids (zero-shot); two splits side by side (one core each), then the third
set -eu
cd /work/main
export PATH=/work/main/.venv/bin:$PATH
R=/work/run23; O=results/wip_run28
W=results/wip_run26/run26
C="run27=/work/run27/run27 lr1=/work/run28/lr1 v16k=/work/run28/v16k v16k0=/work/run28/run26_v16384"
HELDOUT=$R/heldout_solve.jsonl REFS=$R/refs_solve.jsonl DRAFTER=$W COMPARE="$C" OUTPUT=$O/replay_heldout_solve64_run28_vs_run26.json bash results/replay_heldout/replay_heldout.sh > /work/run28/replay_solve.log 2>&1 &
HELDOUT=$R/heldout.jsonl REFS=$R/refs.jsonl DRAFTER=$W COMPARE="$C" OUTPUT=$O/replay_heldout64_run28_vs_run26.json bash results/replay_heldout/replay_heldout.sh > /work/run28/replay_first.log 2>&1
wait
HELDOUT=$R/heldout_math.jsonl REFS=$R/refs_math.jsonl DRAFTER=$W COMPARE="$C" OUTPUT=$O/replay_heldout_math64_run28_vs_run26.json bash results/replay_heldout/replay_heldout.sh > /work/run28/replay_math.log 2>&1
echo "$(date +%T) REPLAYS_DONE"
