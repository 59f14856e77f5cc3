#!/usr/bin/env bash
# call40f: call40e's GPU tests, which its 220 s cap cut after 65 results (none failed), again with
# a longer cap: test_backward_portable.py first (the slow file), then the three others, the
# portable target forced, 16 workers, the slowest durations listed. Carry .gpu/site.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.gpu/site:$PWD
mkdir -p "$OUT"
timeout 420 env CCE_TEST_DEVICE=cuda CCE_OWN_TARGET=portable python3 -m pytest -q -rs -n 16 \
  --durations 8 -p no:cacheprovider tests/test_backward_portable.py tests/test_correctness.py \
  tests/test_autograd_paths.py tests/test_pointer_loads.py > "$OUT/gpu-tests-portable.log" 2>&1
echo "gpu tests (portable): exit $?"; grep -v -i warn "$OUT/gpu-tests-portable.log" | tail -n 24
