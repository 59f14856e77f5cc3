#!/usr/bin/env bash
# call32b: test_fused.py's and test_backward_portable.py's GPU cases with the portable target
# forced (call32a's cap cut the last of them; its test_fused failures were the test's), then
# the frontier's portable step (frontier.md: N 8192, D 1536, V 151936) with target-shifted logits
# the default, D 7168's head and a 32k head: the default against its fp32 logits (@fp32) and
# torch.compile. Carry .gpu/site. The portable step's folder (RUN=/tmp/run/portable) is committed
# as results/notes/frontier-h200/portable.
set -u
export CCE_BENCH_COMMIT=${CCE_BENCH_COMMIT:?the commit}
export PYTHONPATH=$PWD/.gpu/site:$PWD
START=$SECONDS DEADLINE=${DEADLINE_S:-545}
source suite/kernel/deadline_steps.sh
RUN=/tmp/run/tests-portable-2
start_run tests
capped_step "gpu tests, portable forced" "${TESTS_CAP_S:-170}" env CCE_OWN_TARGET=portable \
  CCE_TEST_DEVICE=cuda python3 -m pytest -v -rs -n 8 -p no:cacheprovider \
  tests/test_fused.py tests/test_backward_portable.py
grep -E "passed|failed|FAILED|ERROR" "$LOG" | tail -8
RUN=/tmp/run/portable HEADS_DEADLINE_S=$(( $(left) - 230 )) HEADS=8192x1536x151936 ROUNDS=2 \
  REPS=20 PROVIDERS=own_portable,own_portable_fused,torch_compile bash suite/kernel/heads_gpu.sh
RUN=/tmp/run/heads-fp32 HEADS_DEADLINE_S=$(left) HEADS="4096x7168x129280 16384x4096x32000" \
  ROUNDS=2 REPS=20 PROVIDERS=own_portable,own_portable@fp32,torch_compile \
  BENCH_ARGS='--variant own_portable@fp32={"fused":{"target_shift":false}}' \
  bash suite/kernel/heads_gpu.sh
