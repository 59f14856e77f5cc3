#!/usr/bin/env bash
# The frontier at qwen25-7b and gemma2-2b with the forward step, at call24e's commit (313aafd),
# in the device time left. Carry .gpu/site and .torch-lce.
set -u
SHAPES="qwen25-7b gemma2-2b" FORWARD=1 FRONTIER_DEADLINE_S=470 RUN=/tmp/run/frontier-b-h200 \
  bash suite/kernel/frontier_gpu.sh 2>&1 | grep -v "^$" | cut -c1-160 | tail -n 8
