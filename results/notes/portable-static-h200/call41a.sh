#!/usr/bin/env bash
# call41a: (1) the GPU tests of the target-shifted pass with its partials in dE's rows (14928e5),
# forced portable and at the board's own target; (2) the portable loss+grad against a static
# torch.compile at the frontier's eight cells (the interleave tool compiles afresh per head since
# b23cf55), 1 GiB default, 10 sweeps, round 1. Carry .gpu/site.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.gpu/site:$PWD
mkdir -p "$OUT"
timeout 100 env CCE_TEST_DEVICE=cuda CCE_OWN_TARGET=portable python3 -m pytest -q \
  -p no:cacheprovider tests/test_target_shift.py > "$OUT/gpu-tests-portable.log" 2>&1
echo "gpu tests portable: exit $?"; tail -2 "$OUT/gpu-tests-portable.log"
timeout 60 env CCE_TEST_DEVICE=cuda python3 -m pytest -q \
  -p no:cacheprovider tests/test_target_shift.py > "$OUT/gpu-tests.log" 2>&1
echo "gpu tests: exit $?"; tail -2 "$OUT/gpu-tests.log"
export CCE_OWN_TARGET=portable
show() { python3 -c "import csv
for r in csv.DictReader(open('$1')):
    print(r['head'], r['entry'], r['status'][:30], r['chunks'], round(float(r['ms'] or 'nan'),2), r['floors'], r['ms_over_compile'], r['vs_compile'], round(float(r['peak_mib'] or 'nan')))"; }
HEADS=8192x4096x128256,8192x2304x256000x30,16384x3584x152064,8192x5120x131072
HEADS=$HEADS,16384x1152x262144,4096x7168x129280,8192x8192x152064,16384x2048x49152
SECONDS=0
CCE_OWN_TUNE_CACHE=$OUT/tiles-p.json timeout 400 python3 -m suite kernel interleave \
  --out "$OUT/round-1" --heads "$HEADS" --budgets default --compile --reps 10 \
  > "$OUT/round-1-log.txt" 2>&1
echo "round 1: exit $? in ${SECONDS}s"; show "$OUT/round-1/interleave.csv"
cd "$OUT" && tar czf /tmp/call.tgz . && mv /tmp/call.tgz ./call.tgz && ls -la call.tgz
