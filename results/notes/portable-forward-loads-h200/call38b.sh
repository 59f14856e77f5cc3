#!/usr/bin/env bash
# call38b: the pointer forward's in-bounds loads (forward.in_bounds_loads: clamped rows and
# columns read unmasked, no depth mask where D is a multiple of 64), after call38a's ncu put
# most of the forward's stall samples on the masked loads' address and predicate chains.
# (1) The GPU test (bit for bit against the masked loads, and fp64); (2) interleaved sweeps,
# pinned pick and autotuned, at four heads; (3) the same blocked, 3 untimed calls a block,
# with clocks; (4) ncu's tensor-pipe activity of both at V 49152. Carry .gpu/site.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.gpu/site:$PWD
mkdir -p "$OUT"
CCE_TEST_DEVICE=cuda timeout 200 python3 -m pytest -q -p no:cacheprovider \
  tests/test_forward_loads.py > "$OUT/gpu-tests.log" 2>&1
echo "gpu tests: exit $?"; tail -2 "$OUT/gpu-tests.log"
export CCE_OWN_TARGET=portable
PIN='"autotune":false,"forward":{"tiles":{"block_n":128,"block_v":256,"block_d":64,"num_warps":8,"num_stages":3}'
HEADS=16384x2048x49152,16384x1152x262144,8192x1536x151936,8192x2304x256000x30
VARIANTS=("pin={$PIN}}" "pin_inb={$PIN,\"in_bounds_loads\":true}}"
          'inb={"forward":{"in_bounds_loads":true}}')
show() { python3 -c "import csv
for r in csv.DictReader(open('$1')):
    print(r['head'], r['entry'], r['status'][:30], r['ms'], r['ms_p20'], r['ms_p80'], r['floors'], r['vs_base'], r.get('sm_mhz', ''), r.get('power_w', ''))"; }
CCE_OWN_TUNE_CACHE=$OUT/tiles-i.json timeout 200 python3 -m suite kernel interleave \
  --out "$OUT/interleaved" --heads "$HEADS" --phase fwd --reps 30 --variants "${VARIANTS[@]}" \
  > "$OUT/interleaved-log.txt" 2>&1
echo "interleaved: exit $?"; show "$OUT/interleaved/interleave.csv"
CCE_OWN_TUNE_CACHE=$OUT/tiles-b.json timeout 200 python3 -m suite kernel interleave \
  --out "$OUT/blocked" --heads "$HEADS" --phase fwd --reps 30 --order blocked --settle 3 \
  --clocks --variants "${VARIANTS[@]}" > "$OUT/blocked-log.txt" 2>&1
echo "blocked: exit $?"; show "$OUT/blocked/interleave.csv"
for v in false true; do
  CCE_OWN_CONFIG="{$PIN,\"in_bounds_loads\":$v}}" timeout -k 5 90 ncu --clock-control none \
    -k regex:"cce_fwd_kernel" --launch-count 1 --section SpeedOfLight \
    --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,gpu__time_duration.sum \
    python3 -m suite kernel profile fwd --n 16384 --d 2048 --v 49152 --softcap 0 \
    > "$OUT/ncu-inb-$v.txt" 2>&1
  echo "ncu in_bounds $v: exit $?"
  grep -E "Duration|hmma|Compute \(SM\)" "$OUT/ncu-inb-$v.txt" | head -4
done
cd "$OUT" && tar czf /tmp/call38b.tgz . && mv /tmp/call38b.tgz . && ls -la call38b.tgz
