#!/usr/bin/env bash
# The Gluon kernels' GPU tests, then the frontier at d1152, llama3-8b and d5120 with the forward
# step (FORWARD=1: the Gluon forward since 3ac31cf; the Gluon W writer on the recompute and
# zero-budget points since this commit). Carry .gpu/site and .torch-lce.
set -u
TESTS=1 TEST_WORKERS=4 TESTS_CAP_S=100 GPU_TESTS="tests/test_dlogits_ws.py tests/test_forward_ws.py" \
  SHAPES="d1152 llama3-8b d5120" FORWARD=1 FRONTIER_DEADLINE_S=575 \
  bash suite/kernel/frontier_gpu.sh 2>&1 | grep -v "^$" | cut -c1-160 | tail -n 50
