#!/usr/bin/env bash
# call41f: dC's buffer made at its first GEMM, the per-row vectors gone before it (this
# commit). (1) GPU tests of the fused path, forced portable and at Hopper's target; (2) the
# memory tool's peak at N 4096, D 7168, V 129280, both targets; (3) the one-chunk calls against
# a static torch.compile: N 4096, D 7168 (every budget one chunk) and N 8192, D 5120 at 3 GiB,
# forced portable and at Hopper's target. Carry .gpu/site.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.gpu/site:$PWD
mkdir -p "$OUT"
FILES="tests/test_fused.py tests/test_target_shift.py"
timeout 110 env CCE_TEST_DEVICE=cuda CCE_OWN_TARGET=portable python3 -m pytest -q -rs -n 16 \
  -p no:cacheprovider $FILES > "$OUT/gpu-tests-portable.log" 2>&1
echo "gpu tests (portable): exit $?"; tail -1 "$OUT/gpu-tests-portable.log"
timeout 70 env CCE_TEST_DEVICE=cuda python3 -m pytest -q -rs -n 16 \
  -p no:cacheprovider $FILES > "$OUT/gpu-tests.log" 2>&1
echo "gpu tests: exit $?"; tail -1 "$OUT/gpu-tests.log"
for target in portable hopper; do
  env_target=(); [ $target = portable ] && env_target=(CCE_OWN_TARGET=portable)
  timeout 40 env "${env_target[@]}" python3 -m suite kernel memory --n 4096 --d 7168 \
    --v 129280 --softcap 0 --list-kib 0.5 > "$OUT/memory-d7168-$target.txt" 2>&1
  echo "memory $target: exit $?"; cat "$OUT/memory-d7168-$target.txt"
  SECONDS=0
  timeout 110 env "${env_target[@]}" CCE_OWN_TUNE_CACHE=$OUT/tiles-$target.json python3 -m suite \
    kernel interleave --out "$OUT/one-chunk-$target" --heads 4096x7168x129280,8192x5120x131072 \
    --budgets default,3072 --compile --reps 10 > "$OUT/one-chunk-$target-log.txt" 2>&1
  echo "one-chunk $target: exit $? in ${SECONDS}s"; grep -E "^[0-9]+x" "$OUT/one-chunk-$target-log.txt"
done
cd "$OUT" && tar czf /tmp/call.tgz . && mv /tmp/call.tgz ./call.tgz && ls -la call.tgz
