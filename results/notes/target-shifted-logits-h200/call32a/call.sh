#!/usr/bin/env bash
# call32a: the portable config with target-shifted logits by default. First the GPU cases of
# the three-matmul path's tests with the portable target forced (CCE_OWN_TARGET=portable), then
# loss+grad at two heads the 31st session's runs did not finish (Gemma 2 (2B)'s softcapped
# head, D 7168), the default against its fp32 logits (@fp32) and torch.compile. Carry .gpu/site.
set -u
export CCE_BENCH_COMMIT=${CCE_BENCH_COMMIT:?the commit}
export PYTHONPATH=$PWD/.gpu/site:$PWD
START=$SECONDS DEADLINE=${DEADLINE_S:-545}
source suite/kernel/deadline_steps.sh
RUN=/tmp/run/tests-portable
start_run tests
capped_step "gpu tests, portable forced" "${TESTS_CAP_S:-240}" env CCE_OWN_TARGET=portable \
  CCE_TEST_DEVICE=cuda python3 -m pytest -v -rs -n 8 -p no:cacheprovider \
  tests/test_target_shift.py tests/test_fused.py tests/test_autograd_paths.py \
  tests/test_backward_portable.py
grep -E "passed|failed|FAILED|ERROR" "$LOG" | tail -8
HEADS_DEADLINE_S=$(left) HEADS="8192x2304x256000x30 4096x7168x129280" ROUNDS=2 REPS=20 \
  PROVIDERS=own_portable,own_portable@fp32,own_portable_fused,torch_compile \
  BENCH_ARGS='--variant own_portable@fp32={"fused":{"target_shift":false}}' \
  bash suite/kernel/heads_gpu.sh
