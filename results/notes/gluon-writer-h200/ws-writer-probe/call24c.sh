#!/usr/bin/env bash
# dE of repeated budget-0 calls at D 1152, V 262144 against fp64 (repeat.py), with each writer
# and with the recompute path forced, then the GPU tests of test_dlogits_ws.py.
set -uo pipefail
export PYTHONUNBUFFERED=1
mkdir -p $OUT
H=results/notes/gluon-writer-h200/ws-writer-probe
timeout 150 python3 $H/repeat.py 8192x1152x262144 3 '{}' '{"recompute":{"ws":false}}' \
  '{"forward":{"ws":false},"recompute":{"ws":false}}' '{"fused":{"zero_budget":"recompute"}}' \
  2>&1 | tee $OUT/repeat.log | cut -c1-200
timeout 200 env CCE_TEST_DEVICE=cuda python3 -m pytest -q -x -p no:cacheprovider -n 4 \
  tests/test_dlogits_ws.py > $OUT/gpu-tests.log 2>&1; tail -3 $OUT/gpu-tests.log
