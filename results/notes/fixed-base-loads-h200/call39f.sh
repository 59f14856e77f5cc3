#!/usr/bin/env bash
# call39f: call39e's lead further: the Hopper forward's grid at N 16384, D 2048, V 49152 (and
# N 16384, D 1152, V 262144 beside it): two programs per SM, no or two tiles of per-program
# overhead in the split count, the split order, the short split last; interleaved (30 sweeps),
# then blocked (3 untimed calls a block, clocks). Carry .gpu/site.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.gpu/site:$PWD
mkdir -p "$OUT"
show() { python3 -c "import csv
for r in csv.DictReader(open('$1')):
    print(r['head'], r['entry'], r['status'][:30], r['ms'], r['ms_p20'], r['ms_p80'], r['floors'], r['vs_base'], r.get('sm_mhz', ''))"; }
VARIANTS=('pps2={"forward":{"programs_per_sm":2}}' 'ovh0={"forward":{"program_overhead_tiles":0}}'
          'ovh2={"forward":{"program_overhead_tiles":2}}' 'split={"forward":{"makespan_order":"split"}}'
          'short_last={"forward":{"short_split_last":true}}')
for order in interleaved blocked; do
  extra=(); [ $order = blocked ] && extra=(--order blocked --settle 3 --clocks)
  CCE_OWN_TUNE_CACHE=$OUT/tiles.json timeout 120 python3 -m suite kernel interleave \
    --out "$OUT/$order" --heads 16384x2048x49152,16384x1152x262144 --phase fwd --reps 30 \
    --variants "${VARIANTS[@]}" "${extra[@]}" > "$OUT/$order-log.txt" 2>&1
  echo "$order: exit $?"; show "$OUT/$order/interleave.csv"
done
cd "$OUT" && tar czf /tmp/call39f.tgz . && mv /tmp/call39f.tgz . && ls -la call39f.tgz
