#!/usr/bin/env bash
# call41b: (1) test_target_shift's autocast test on the GPU with the portable target pinned
# (call41a: Hopper's target took its own path); (2) the portable loss+grad against a static
# torch.compile at the eight cells, round 2, at the 1 GiB default and budgets of 2 and 3 GiB;
# (3) the dynamic compile's size: three heads in one process with the tool before b23cf55
# (.gpu/old = git archive 590e3b7 suite own_kernel; own_kernel is HEAD's) and with the fixed
# tool. Carry .gpu/site and .gpu/old.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.gpu/site:$PWD
mkdir -p "$OUT"
timeout 60 env CCE_TEST_DEVICE=cuda python3 -m pytest -q \
  -p no:cacheprovider tests/test_target_shift.py > "$OUT/gpu-tests.log" 2>&1
echo "gpu tests: exit $?"; tail -1 "$OUT/gpu-tests.log"
export CCE_OWN_TARGET=portable
show() { python3 -c "import csv
for r in csv.DictReader(open('$1')):
    print(r['head'], r['entry'], r['status'][:30], r['chunks'], round(float(r['ms'] or 'nan'),2), r['floors'], r['ms_over_compile'], r['vs_compile'], round(float(r['peak_mib'] or 'nan')))"; }
HEADS=8192x4096x128256,8192x2304x256000x30,16384x3584x152064,8192x5120x131072
HEADS=$HEADS,16384x1152x262144,4096x7168x129280,8192x8192x152064,16384x2048x49152
SECONDS=0
CCE_OWN_TUNE_CACHE=$OUT/tiles-p.json timeout 330 python3 -m suite kernel interleave \
  --out "$OUT/round-2" --heads "$HEADS" --budgets default,2048,3072 --compile --reps 10 \
  > "$OUT/round-2-log.txt" 2>&1
echo "round 2: exit $? in ${SECONDS}s"; show "$OUT/round-2/interleave.csv"
THREE=8192x4096x128256,16384x1152x262144,16384x2048x49152
for tool in old fixed; do
  SECONDS=0
  dir=$PWD; [ $tool = old ] && dir=$PWD/.gpu/old
  (cd "$dir" && PYTHONPATH=$PWD/../site:$PWD:${PYTHONPATH} CCE_OWN_TUNE_CACHE=$OUT/tiles-p.json \
     timeout 120 python3 -m suite kernel interleave --out "$OUT/compile-$tool" --heads "$THREE" \
     --budgets default --compile --reps 10 > "$OUT/compile-$tool-log.txt" 2>&1)
  echo "compile $tool: exit $? in ${SECONDS}s"; show "$OUT/compile-$tool/interleave.csv"
done
cd "$OUT" && tar czf /tmp/call.tgz . && mv /tmp/call.tgz ./call.tgz && ls -la call.tgz
