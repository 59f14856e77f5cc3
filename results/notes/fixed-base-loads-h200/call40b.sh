#!/usr/bin/env bash
# call40b: (1) call40a's second round for the W writer's pair (both load options) against base,
# low_memory=True, forced portable, at call40a's two heads and a third (D 4096, V 32000),
# interleaved (30 sweeps) and blocked (3 untimed calls a block, clocks); (2) the portable
# target's loss+grad at the frontier's four first cells against torch.compile, interleaved,
# at the 1 GiB default and a 3 GiB budget (frontier.md: not re-run since 35e8aa3). Carry .gpu/site.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.gpu/site:$PWD
mkdir -p "$OUT"
export CCE_OWN_TARGET=portable
show() { python3 -c "import csv
for r in csv.DictReader(open('$1')):
    print(r['head'], r['entry'], r['budget'], r['status'][:30], r['chunks'], r['ms'], r['ms_p20'], r['ms_p80'], r['floors'], r['vs_base'], r['ms_over_compile'], r['vs_compile'], r['peak_mib'], r.get('sm_mhz', ''))"; }
W_HEADS=16384x2048x49152,8192x1536x151936,8192x4096x32000
W_VAR='both={"dlogits_in_bounds_loads":true,"dlogits_fixed_base_loads":true}'
for order in interleaved blocked; do
  extra=(--reps 30); [ $order = blocked ] && extra=(--reps 20 --order blocked --settle 3 --clocks)
  CCE_OWN_TUNE_CACHE=$OUT/tiles-w.json timeout 130 python3 -m suite kernel interleave \
    --out "$OUT/w-$order" --heads "$W_HEADS" --variants "$W_VAR" --low-memory \
    "${extra[@]}" > "$OUT/w-$order-log.txt" 2>&1
  echo "w $order: exit $?"; show "$OUT/w-$order/interleave.csv"
done
P_HEADS=${P_HEADS:-8192x4096x128256,8192x2304x256000x30,16384x3584x152064,8192x5120x131072}
CCE_OWN_TUNE_CACHE=$OUT/tiles-p.json timeout ${P_TIMEOUT:-280} python3 -m suite kernel interleave \
  --out "$OUT/portable" --heads "$P_HEADS" --budgets default,3072 --compile --reps 10 \
  > "$OUT/portable-log.txt" 2>&1
echo "portable: exit $?"; show "$OUT/portable/interleave.csv"
cd "$OUT" && tar czf /tmp/call.tgz . && mv /tmp/call.tgz ./call.tgz && ls -la call.tgz
