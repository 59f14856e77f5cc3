#!/usr/bin/env bash
# call38f: whole calls on the GPU with the in-bounds loads on by default (24bf0c2), the portable
# target forced so that every forward is the pointer kernel's: test_correctness.py and
# test_autograd_paths.py (call38d's 150 s cap cut them), 16 workers. Carry .gpu/site.
set -u
mkdir -p "$OUT"
timeout 250 env CCE_TEST_DEVICE=cuda CCE_OWN_TARGET=portable PYTHONPATH=$PWD/.gpu/site:$PWD \
  python3 -m pytest -q -rs -n 16 -p no:cacheprovider tests/test_correctness.py \
  tests/test_autograd_paths.py > "$OUT/gpu-tests-portable.log" 2>&1
echo "gpu tests (portable): exit $?"; tail -n 12 "$OUT/gpu-tests-portable.log"
