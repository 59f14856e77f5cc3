#!/usr/bin/env bash
# Probe of the ws writer's dE at budget 0 (probe.py), then the GPU tests of test_dlogits_ws.py.
set -uo pipefail
export PYTHONUNBUFFERED=1
mkdir -p $OUT
timeout 200 python3 results/notes/gluon-writer-h200/ws-writer-probe/probe.py \
  1024x1152x262144,8192x1152x262144,2048x4096x128256 2>&1 | tee $OUT/probe.log | cut -c1-250
