#!/usr/bin/env bash
# Kills the helper rollout process once the main stage's folder lacks at most 2 rows (the main process fills those).
M=/work/run29/retrace29f32/rollouts
while true; do
  n=$(ls $M | wc -l)
  if [ $n -ge 606 ]; then
    pkill -f "dflash-retrace train.*helper"; sleep 5; pkill -f mover.sh
    echo "$(date +%T) killed helper at $n files"; exit 0
  fi
  sleep 15
done
