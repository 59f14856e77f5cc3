#!/usr/bin/env bash
# call39b: call39a's second round, with twice the interleaved reps (call39a: level interleaved
# at all four heads, faster blocked at two with the pinned pick and one autotuned, slower at
# none). The forward forced portable, interleaved (60 reps) and blocked (3 untimed calls a block,
# clocks); the W writer's loss+grad low_memory at two heads, interleaved and blocked.
# Carry .gpu/site.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.gpu/site:$PWD
mkdir -p "$OUT"
export CCE_OWN_TARGET=portable
PIN='"autotune":false,"forward":{"tiles":{"block_n":128,"block_v":256,"block_d":64,"num_warps":8,"num_stages":3}'
HEADS=16384x2048x49152,16384x1152x262144,8192x1536x151936,8192x2304x256000x30
VARIANTS=("pin={$PIN}}" "pin_fixed={$PIN,\"fixed_base_loads\":true}}"
          'fixed={"forward":{"fixed_base_loads":true}}')
show() { python3 -c "import csv
for r in csv.DictReader(open('$1')):
    print(r['head'], r['entry'], r['status'][:30], r['ms'], r['ms_p20'], r['ms_p80'], r['floors'], r['vs_base'], r.get('sm_mhz', ''))"; }
CCE_OWN_TUNE_CACHE=$OUT/tiles-i.json timeout 200 python3 -m suite kernel interleave \
  --out "$OUT/interleaved" --heads "$HEADS" --phase fwd --reps 60 --variants "${VARIANTS[@]}" \
  > "$OUT/interleaved-log.txt" 2>&1
echo "interleaved: exit $?"; show "$OUT/interleaved/interleave.csv"
CCE_OWN_TUNE_CACHE=$OUT/tiles-b.json timeout 170 python3 -m suite kernel interleave \
  --out "$OUT/blocked" --heads "$HEADS" --phase fwd --reps 30 --order blocked --settle 3 \
  --clocks --variants "${VARIANTS[@]}" > "$OUT/blocked-log.txt" 2>&1
echo "blocked: exit $?"; show "$OUT/blocked/interleave.csv"
W_HEADS=16384x2048x49152,8192x1536x151936
W_VAR='fixed={"dlogits_fixed_base_loads":true}'
for order in interleaved blocked; do
  extra=(); [ $order = blocked ] && extra=(--order blocked --settle 3 --clocks)
  CCE_OWN_TUNE_CACHE=$OUT/tiles-w.json timeout 120 python3 -m suite kernel interleave \
    --out "$OUT/w-$order" --heads "$W_HEADS" --variants "$W_VAR" --reps 15 --low-memory \
    "${extra[@]}" > "$OUT/w-$order-log.txt" 2>&1
  echo "w $order: exit $?"; show "$OUT/w-$order/interleave.csv"
done
cd "$OUT" && tar czf /tmp/call39b.tgz . && mv /tmp/call39b.tgz . && ls -la call39b.tgz
