#!/usr/bin/env bash
# The gate at HEAD against the committed H200 baseline (7a96a07), then a new baseline
# (4 fresh processes) and one unchanged check against it.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.gpu/site:$PWD/.gpu/gate-site
mkdir -p $OUT/gate
S=$SECONDS
timeout -k 10 120 python3 -m suite gate --report $OUT/gate/check-old.report.json \
  > $OUT/gate/check-old.log 2>&1
echo "check against the committed baseline rc $? at $((SECONDS-S)) s"; tail -2 $OUT/gate/check-old.log
timeout -k 10 330 python3 -m suite gate --save --baseline $OUT/gate/nvidia-h200.json \
  --processes-dir $OUT/gate/processes > $OUT/gate/save.log 2>&1
echo "save rc $? at $((SECONDS-S)) s"
timeout -k 10 110 python3 -m suite gate --baseline $OUT/gate/nvidia-h200.json \
  --report $OUT/gate/check.report.json > $OUT/gate/check.log 2>&1
echo "check rc $? at $((SECONDS-S)) s"
tail -2 $OUT/gate/save.log; grep -E "FAIL|fail" $OUT/gate/check-old.log | head -8; tail -2 $OUT/gate/check.log
