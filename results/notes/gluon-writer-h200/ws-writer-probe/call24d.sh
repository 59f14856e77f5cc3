#!/usr/bin/env bash
# interleave's dE difference at D 1152 checked against fp64 (interleave_check.py), with a
# variant the same as the base and the TMA writer; then test_dlogits_ws.py on the GPU.
set -uo pipefail
export PYTHONUNBUFFERED=1
mkdir -p $OUT
H=results/notes/gluon-writer-h200/ws-writer-probe
timeout 150 python3 $H/interleave_check.py 8192x1152x262144 'same={}' \
  'tma={"recompute":{"ws":false}}' 2>&1 | grep -v Warning | tee $OUT/interleave-check.log | cut -c1-200
timeout 200 env CCE_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider -n 4 \
  tests/test_dlogits_ws.py > $OUT/gpu-tests.log 2>&1; tail -3 $OUT/gpu-tests.log
