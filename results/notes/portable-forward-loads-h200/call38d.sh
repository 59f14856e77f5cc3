#!/usr/bin/env bash
# call38d: a second round of the frontier's forward step at 09193dd (in-bounds loads on), to
# see call38c's portable forward at N 16384, D 2048, V 49152 (just under 1.25 floors) again in
# fresh processes; before it, whole calls on the GPU with the portable target forced
# (test_correctness.py, test_autograd_paths.py: the pointer forward inside them). Carry .gpu/site.
set -u
export CCE_BENCH_COMMIT=${CCE_BENCH_COMMIT:?the commit}
mkdir -p "$OUT"
timeout 150 env CCE_TEST_DEVICE=cuda CCE_OWN_TARGET=portable PYTHONPATH=$PWD/.gpu/site:$PWD \
  python3 -m pytest -q -rs -n 8 -p no:cacheprovider tests/test_correctness.py \
  tests/test_autograd_paths.py > "$OUT/gpu-tests-portable.log" 2>&1
echo "gpu tests (portable): exit $?"; tail -n 4 "$OUT/gpu-tests-portable.log"
DEADLINE_S=400 bash results/notes/frontier-h200/forward-launch-order/call36f.sh 2>&1 | tail -n 27
