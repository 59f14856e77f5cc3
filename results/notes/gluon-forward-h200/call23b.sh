#!/usr/bin/env bash
# Why ws_lse faulted (call23a: "unspecified launch failure" at every head): small shapes, one
# process per configuration, launches blocking.
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD CUDA_LAUNCH_BLOCKING=1
D=results/notes/gluon-forward-h200
mkdir -p $OUT
which compute-sanitizer || ls /usr/local/cuda*/bin 2>/dev/null | head
for shape in "256 128 1024" "1024 512 8192"; do
  for kw in '{"pingpong": false}' '{"pingpong": false, "maxnreg": null}' '{}' '{"maxnreg": null}' \
            '{"stages": 2}' '{"pingpong": false, "splits": 1}' '{"splits": 1}'; do
    timeout 60 python3 $D/diag.py $shape "$kw" 2>&1 | grep -E "^ok|Error|error" | head -2 | \
      sed "s|^|$shape $kw: |" | tee -a $OUT/diag.log
  done
done
