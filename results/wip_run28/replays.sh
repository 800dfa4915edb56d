#!/usr/bin/env bash
# Selection replays on the three held-out splits (results/wip_run28/README.md), two splits side by side (one core
# each), then the third. Run 28's (the default): run 26 against the control (run27), both arms and run 26 with
# 16,384 ids (zero-shot). W=<baseline folder> C="label=folder ..." NAME=<report tag> override (replays29.sh).
set -eu
cd /work/main
export PATH=/work/main/.venv/bin:$PATH
R=/work/run23; O=results/wip_run28; L=/work/run28
W=${W:-results/wip_run26/run26}
C=${C:-"run27=/work/run27/run27 lr1=/work/run28/lr1 v16k=/work/run28/v16k v16k0=/work/run28/run26_v16384"}
NAME=${NAME:-run28_vs_run26}
run() { HELDOUT=$R/heldout$1.jsonl REFS=$R/refs$1.jsonl DRAFTER=$W COMPARE="$C" \
  OUTPUT=$O/replay_heldout${1}64_$NAME.json bash results/replay_heldout/replay_heldout.sh > $L/replay_${NAME}$1.log 2>&1; }
run _solve &
run ""
wait
run _math
echo "$(date +%T) REPLAYS_DONE $NAME"
