#!/usr/bin/env bash
# call40e: with the W writer's pair on (a2c981f): (1) whole calls on the GPU with the portable
# target forced (test_correctness.py, test_autograd_paths.py, test_pointer_loads.py,
# test_backward_portable.py, 16 workers); (2) call40c's portable loss+grad against torch.compile
# at the frontier's eight cells, a second round. Carry .gpu/site.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.gpu/site:$PWD
mkdir -p "$OUT"
timeout 220 env CCE_TEST_DEVICE=cuda CCE_OWN_TARGET=portable python3 -m pytest -q -rs -n 16 \
  -p no:cacheprovider tests/test_correctness.py tests/test_autograd_paths.py \
  tests/test_pointer_loads.py tests/test_backward_portable.py > "$OUT/gpu-tests-portable.log" 2>&1
echo "gpu tests (portable): exit $?"; tail -n 8 "$OUT/gpu-tests-portable.log"
export CCE_OWN_TARGET=portable
HEADS=8192x4096x128256,8192x2304x256000x30,16384x3584x152064,8192x5120x131072
HEADS=$HEADS,16384x1152x262144,4096x7168x129280,8192x8192x152064,16384x2048x49152
CCE_OWN_TUNE_CACHE=$OUT/tiles-p.json timeout 330 python3 -m suite kernel interleave \
  --out "$OUT/portable" --heads "$HEADS" --budgets default,2048,3072 --compile --reps 10 \
  > "$OUT/portable-log.txt" 2>&1
echo "portable: exit $?"; tail -n 36 "$OUT/portable-log.txt"
cd "$OUT" && tar czf /tmp/call.tgz . && mv /tmp/call.tgz ./call.tgz && ls -la call.tgz
