#!/usr/bin/env bash
# waits for run 29, then its replays
while ! grep -q RUN29_DONE /work/run28/run29.log; do sleep 20; done
/work/run28/replays29.sh
