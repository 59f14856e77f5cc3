#!/usr/bin/env bash
# call39d: call39c's forward step again (its second round at the same kernel: call39c put the
# V 49152 head over both forward targets, with that cell's cuBLAS floor 5 % under the earlier
# rounds'), then whole calls on the GPU with the portable target forced (test_correctness.py,
# test_autograd_paths.py, test_pointer_loads.py, 16 workers), fixed-base loads on.
# Carry .gpu/site. As first run (e937688) the machine was warm from call39c, whose run folder
# the step's --resume took as done (the same rows again), and test_pointer_loads counted the
# portable target's autotune launches; run again at a later commit with both fixed.
set -u
export CCE_BENCH_COMMIT=${CCE_BENCH_COMMIT:?the commit}
mkdir -p "$OUT"
rm -rf /tmp/run/forward  # a warm machine keeps call39c's folder: --resume would skip every cell
DEADLINE_S=320 bash results/notes/fixed-base-loads-h200/call39c.sh 2>&1 | tail -n 26
timeout 220 env CCE_TEST_DEVICE=cuda CCE_OWN_TARGET=portable PYTHONPATH=$PWD/.gpu/site:$PWD \
  python3 -m pytest -q -rs -n 16 -p no:cacheprovider tests/test_correctness.py \
  tests/test_autograd_paths.py tests/test_pointer_loads.py > "$OUT/gpu-tests-portable.log" 2>&1
echo "gpu tests (portable): exit $?"; tail -n 6 "$OUT/gpu-tests-portable.log"
