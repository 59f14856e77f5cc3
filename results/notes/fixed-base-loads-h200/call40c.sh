#!/usr/bin/env bash
# call40c: the W writer's pair on by default (both dlogits load options). (1) The GPU test of the
# loads (bit for bit against the masked loads); (2) the portable target's loss+grad against
# torch.compile at the frontier's eight cells, interleaved, at the 1 GiB default and budgets of
# 2 and 3 GiB (call40b's first four cells, again). Carry .gpu/site.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.gpu/site:$PWD
mkdir -p "$OUT"
timeout 90 env CCE_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider \
  tests/test_pointer_loads.py > "$OUT/gpu-tests.log" 2>&1
echo "gpu tests: exit $?"; tail -2 "$OUT/gpu-tests.log"
export CCE_OWN_TARGET=portable
show() { python3 -c "import csv
for r in csv.DictReader(open('$1')):
    print(r['head'], r['entry'], r['status'][:30], r['chunks'], round(float(r['ms'] or 'nan'),2), r['floors'], r['ms_over_compile'], r['vs_compile'], round(float(r['peak_mib'] or 'nan')))"; }
HEADS=8192x4096x128256,8192x2304x256000x30,16384x3584x152064,8192x5120x131072
HEADS=$HEADS,16384x1152x262144,4096x7168x129280,8192x8192x152064,16384x2048x49152
CCE_OWN_TUNE_CACHE=$OUT/tiles-p.json timeout 420 python3 -m suite kernel interleave \
  --out "$OUT/portable" --heads "$HEADS" --budgets default,2048,3072 --compile --reps 10 \
  > "$OUT/portable-log.txt" 2>&1
echo "portable: exit $?"; show "$OUT/portable/interleave.csv"
cd "$OUT" && tar czf /tmp/call.tgz . && mv /tmp/call.tgz ./call.tgz && ls -la call.tgz
