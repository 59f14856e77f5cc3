#!/usr/bin/env bash
# call38c: forward.in_bounds_loads on by default (call38b: faster at four heads, interleaved and
# blocked). The GPU tests of the pointer forward (test_forward_loads.py, whose bias call38b
# gave in the wrong dtype, and test_forward_cublas.py: the pointer forward against fp64 and the
# cuBLAS one), then the frontier's forward step at this commit (call36f's script: own,
# own_portable, torch_compile at the five shapes and three heads). Carry .gpu/site.
set -u
export CCE_BENCH_COMMIT=${CCE_BENCH_COMMIT:?the commit}
mkdir -p "$OUT"
timeout 150 env CCE_TEST_DEVICE=cuda PYTHONPATH=$PWD/.gpu/site:$PWD python3 -m pytest -q -rs \
  -n 4 -p no:cacheprovider tests/test_forward_loads.py tests/test_forward_cublas.py \
  > "$OUT/gpu-tests.log" 2>&1
echo "gpu tests: exit $?"; tail -n 6 "$OUT/gpu-tests.log"
DEADLINE_S=400 bash results/notes/frontier-h200/forward-launch-order/call36f.sh 2>&1 | tail -n 30
