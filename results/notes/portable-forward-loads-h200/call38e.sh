#!/usr/bin/env bash
# call38e: the pointer W writer's in-bounds loads (dlogits_in_bounds_loads, off), the forward's
# change (call38b) carried over to dlogits.py. The GPU test (W and sums against the masked
# loads'), then loss+grad on the portable target at two heads no preset names: low_memory=True
# (every chunk's W from the pointer writer) interleaved and blocked (3 untimed calls a block,
# clocks), and a zero budget (the recompute path: the tail's W) interleaved. Carry .gpu/site.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.gpu/site:$PWD
mkdir -p "$OUT"
timeout 100 env CCE_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider \
  tests/test_pointer_loads.py > "$OUT/gpu-tests.log" 2>&1
echo "gpu tests: exit $?"; tail -2 "$OUT/gpu-tests.log"
export CCE_OWN_TARGET=portable CCE_OWN_TUNE_CACHE=$OUT/tiles.json
HEADS=16384x2048x49152,8192x1536x151936
VAR='inb={"dlogits_in_bounds_loads":true}'
show() { python3 -c "import csv
for r in csv.DictReader(open('$1')):
    print(r['head'], r['entry'], r['status'][:30], r['path'], r['ms'], r['ms_p20'], r['ms_p80'], r['floors'], r['vs_base'], r.get('sm_mhz', ''))"; }
run() {  # name, extra arguments
  local name=$1; shift
  timeout 150 python3 -m suite kernel interleave --out "$OUT/$name" --heads "$HEADS" \
    --variants "$VAR" --reps 15 "$@" > "$OUT/$name-log.txt" 2>&1
  echo "$name: exit $?"; show "$OUT/$name/interleave.csv"
}
run low-memory --low-memory
run low-memory-blocked --low-memory --order blocked --settle 3 --clocks
run budget0 --budgets 0
cd "$OUT" && tar czf /tmp/call38e.tgz . && mv /tmp/call38e.tgz . && ls -la call38e.tgz
