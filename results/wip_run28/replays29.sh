#!/usr/bin/env bash
# run 29's selection replays: the three held-out splits, v16k (its init, the lineage head) against run 29
W=results/wip_run28/v16k C="run29=/work/run28/run29" NAME=run29_vs_v16k exec bash "$(dirname "$0")/replays.sh"
