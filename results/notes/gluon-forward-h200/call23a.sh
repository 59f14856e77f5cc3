#!/usr/bin/env bash
# The warp-specialised Gluon log-sum-exp prototype (ws_lse.py) against the own forward and the
# cuBLAS floor, one process per head (bench_ws.py), on the heads where the forward's time above
# one floor was measured (frontier.md): two it misses 1.05 at, three it meets it at.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
START=$SECONDS
DEADLINE=${DEADLINE:-560}
source suite/kernel/deadline_steps.sh
start_run ${NAME:-ws-lse}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv | tee -a "$LOG"
HEADS=${HEADS:-16384x2048x49152 4096x7168x129280 8192x4096x128256 8192x5120x131072 8192x8192x152064}
for head in $HEADS; do
  capped_step "head $head" ${HEAD_CAP_S:-150} python3 results/notes/gluon-forward-h200/bench_ws.py \
    "$RUN/$head" $head --reps ${REPS:-30}
done
grep -h "" $RUN/*/ws_lse.csv | sort -u | head -1
for f in $RUN/*/ws_lse.csv; do tail -n +2 "$f"; done | cut -d, -f1,5-11,15 | cut -c1-150
