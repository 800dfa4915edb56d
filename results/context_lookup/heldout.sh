#!/usr/bin/env bash
# Selection of lookup_threshold on the three held-out splits (never an evaluation set): exact fp32 replay, 64 prompts,
# 64 new tokens, run 29 with draft_vocab_context on (results/ship29/prepare.sh) against copies of it with
# lookup_threshold 0.5 / 0.6 / 0.7 / 0.8 (configs only; the weights are the same files).
#   SHIP=/tmp/ship29 HO=/work/ho bash results/context_lookup/heldout.sh
set -euo pipefail
SHIP=${SHIP:-/tmp/ship29}; HO=${HO:-/work/ho}; LK=${LK:-/tmp/lk}
for t in 0.5 0.6 0.7 0.8; do
  python results/context_lookup/with_lookup.py "$SHIP/smollm2-135m-instruct-dflash" "$LK/t$t" "$t"
done
for split in solve:_solve first: math:_math; do
  name=${split%%:*}; suffix=${split#*:}
  HELDOUT=$HO/heldout$suffix.jsonl REFS=$HO/refs$suffix.jsonl DRAFTER=$SHIP/smollm2-135m-instruct-dflash \
    COMPARE="t05=$LK/t0.5 t06=$LK/t0.6 t07=$LK/t0.7 t08=$LK/t0.8" \
    OUTPUT=results/context_lookup/replay_heldout_${name}64_thresholds.json bash results/replay_heldout/replay_heldout.sh
  python -c "import json,sys; from dflash_retrace.evaluation.replay import format_replay; print(format_replay(json.load(open(sys.argv[1]))))" \
    results/context_lookup/replay_heldout_${name}64_thresholds.json
done
