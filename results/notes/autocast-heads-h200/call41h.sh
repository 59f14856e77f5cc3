#!/usr/bin/env bash
# call41h: after the last chunk's dE drops autocast's 16-bit copy of the fp32 weight before
# dC's fp32 buffer is made (this commit): (1) the fused path's GPU reference tests; (2) the
# autocast tool at N 4096, D 7168, V 129280 (one chunk), the default against torch.compile.
# Carry .gpu/site.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.gpu/site:$PWD
mkdir -p "$OUT"
timeout 60 env CCE_TEST_DEVICE=cuda python3 -m pytest -q -n 16 -p no:cacheprovider \
  tests/test_fused.py -k matches_reference > "$OUT/gpu-tests.log" 2>&1
echo "gpu tests: exit $?"; tail -1 "$OUT/gpu-tests.log"
timeout 110 python3 -m suite kernel autocast --out "$OUT/d7168" \
  --shapes d7168-v129280:4096:7168:129280 --providers torch_compile,own --budgets 4096 \
  --reps 10 > "$OUT/d7168.log" 2>&1 || echo "autocast: exit $?"
tail -6 "$OUT/d7168.log"
