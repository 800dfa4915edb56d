#!/usr/bin/env bash
# Moves the helper's finished rollouts (reversed rows) into the main stage's folder under their own row index.
# A helper file j is finished once file j+1 exists. Stops when the main stage has passed the helper's rows.
H=/work/run29/helper/rollouts; M=/work/run29/retrace29f32/rollouts; N=608
while true; do
  for f in $(ls $H 2>/dev/null | sort); do
    j=$((10#${f%.pt})); nxt=$(printf '%07d.pt' $((j+1)))
    [ -f "$H/$nxt" ] || continue
    i=$((N-1-j)); dst=$(printf '%07d.pt' $i)
    if [ -f "$M/$dst" ]; then rm -f "$H/$f"; else mv "$H/$f" "$M/$dst"; fi
  done
  sleep 20
done
