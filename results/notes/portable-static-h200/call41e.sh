#!/usr/bin/env bash
# call41e: GPU tests at this commit (the target-shifted pass's partials in dE's rows since
# 14928e5, which no GPU test file but test_target_shift has run yet): test_fused.py's reference
# cases and test_correctness.py, the portable target forced and at the board's own target,
# 16 workers. Carry .gpu/site.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.gpu/site:$PWD
mkdir -p "$OUT"
FILES="tests/test_fused.py tests/test_correctness.py tests/test_autograd_paths.py"
timeout 230 env CCE_TEST_DEVICE=cuda CCE_OWN_TARGET=portable python3 -m pytest -q -rs -n 16 \
  -p no:cacheprovider $FILES > "$OUT/gpu-tests-portable.log" 2>&1
echo "gpu tests (portable): exit $?"; grep -v -i warn "$OUT/gpu-tests-portable.log" | tail -n 8
timeout 200 env CCE_TEST_DEVICE=cuda python3 -m pytest -q -rs -n 16 \
  -p no:cacheprovider $FILES > "$OUT/gpu-tests.log" 2>&1
echo "gpu tests: exit $?"; grep -v -i warn "$OUT/gpu-tests.log" | tail -n 8
