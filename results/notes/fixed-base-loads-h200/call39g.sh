#!/usr/bin/env bash
# call39g: the GPU tests at the default (Hopper) target with fixed-base loads on, where the
# pointer kernels still run (strides TMA refuses, fp32, batch-invariant partials, the portable
# backward's own cases): test_correctness, test_autograd_paths, test_pointer_loads,
# test_backward_portable, test_batch_invariant, test_determinism, test_entropy, test_fused
# (16 workers). Carry .gpu/site.
set -u
mkdir -p "$OUT"
timeout 230 env CCE_TEST_DEVICE=cuda PYTHONPATH=$PWD/.gpu/site:$PWD python3 -m pytest -q -rs \
  -n 16 -p no:cacheprovider tests/test_correctness.py tests/test_autograd_paths.py \
  tests/test_pointer_loads.py tests/test_backward_portable.py tests/test_batch_invariant.py \
  tests/test_determinism.py tests/test_entropy.py tests/test_fused.py \
  > "$OUT/gpu-tests.log" 2>&1
echo "gpu tests: exit $?"; tail -n 12 "$OUT/gpu-tests.log"
