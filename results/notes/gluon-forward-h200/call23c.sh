#!/usr/bin/env bash
# ws_lse with the consumers' turn barrier (call23b: ping-pong faulted once a consumer waited on
# a stage two uses ahead): the small shapes that faulted, then call23a's bench at five heads.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
D=results/notes/gluon-forward-h200
mkdir -p $OUT
for kw in '{}' '{"splits": 1}' '{"stages": 2, "splits": 1}' '{"pingpong": false}'; do
  CUDA_LAUNCH_BLOCKING=1 timeout 60 python3 $D/diag.py 1024 512 8192 "$kw" 2>&1 | \
    grep -E "^ok|Error|error" | head -2 | sed "s|^|1024 512 8192 $kw: |" | tee -a $OUT/diag.log
done
CUDA_LAUNCH_BLOCKING=1 timeout 60 python3 $D/diag.py 1000 520 8000 '{}' 2>&1 | \
  grep -E "^ok|Error|error" | head -2 | sed "s|^|1000 520 8000: |" | tee -a $OUT/diag.log
if grep -q Error $OUT/diag.log; then echo "diag failed: bench skipped"; exit 1; fi
DEADLINE=480 bash $D/call23a.sh
