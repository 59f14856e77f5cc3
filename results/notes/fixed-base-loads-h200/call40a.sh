#!/usr/bin/env bash
# call40a: the W writer (cce_dlogits_kernel) with both load options on, the pair whose sm90 SASS
# matches the forward's k-loop (dlogits_in_bounds_loads + dlogits_fixed_base_loads), beside each
# alone. (1) GPU tests of the loads and the tile cache's key; (2) loss+grad with
# low_memory=True (every chunk's W from the pointer writer), forced portable, at two heads,
# interleaved and blocked (3 untimed calls a block, clocks). Each variant tunes its own tiles
# (edf5208: the cache key digests the kernel's options). Carry .gpu/site.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.gpu/site:$PWD
mkdir -p "$OUT"
timeout 120 env CCE_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider \
  tests/test_pointer_loads.py tests/test_autotune.py > "$OUT/gpu-tests.log" 2>&1
echo "gpu tests: exit $?"; tail -2 "$OUT/gpu-tests.log"
export CCE_OWN_TARGET=portable
show() { python3 -c "import csv
for r in csv.DictReader(open('$1')):
    print(r['head'], r['entry'], r['status'][:30], r['ms'], r['ms_p20'], r['ms_p80'], r['floors'], r['vs_base'], r.get('sm_mhz', ''))"; }
W_HEADS=16384x2048x49152,8192x1536x151936
W_VARS=('in_bounds={"dlogits_in_bounds_loads":true}' 'fixed={"dlogits_fixed_base_loads":true}'
        'both={"dlogits_in_bounds_loads":true,"dlogits_fixed_base_loads":true}')
for order in interleaved blocked; do
  extra=(); [ $order = blocked ] && extra=(--order blocked --settle 3 --clocks)
  CCE_OWN_TUNE_CACHE=$OUT/tiles-w.json timeout 190 python3 -m suite kernel interleave \
    --out "$OUT/w-$order" --heads "$W_HEADS" --variants "${W_VARS[@]}" --reps 20 --low-memory \
    "${extra[@]}" > "$OUT/w-$order-log.txt" 2>&1
  echo "w $order: exit $?"; show "$OUT/w-$order/interleave.csv"
done
cd "$OUT" && tar czf /tmp/call40a.tgz . && mv /tmp/call40a.tgz . && ls -la call40a.tgz
