#!/usr/bin/env bash
# call34d: call34c found Hopper's default config slower at a 2048 MiB budget (two chunks of
# 4096 rows) than at the 1 GiB default (three) at N 8192, D 3584, V 152064. Again, in another
# process, with 1536 MiB between, and the N 8192, D 8192, V 152064 head's 1 GiB default (a miss
# in frontier.md); then a profile of each budget at the D 3584 head (per-kernel GPU time).
# Carry .gpu/site.
set -u
export CCE_BENCH_COMMIT=${CCE_BENCH_COMMIT:?the commit}
export PYTHONPATH=$PWD/.gpu/site:$PWD
mkdir -p "$OUT"
timeout -k 5 300 python3 -m suite kernel interleave --out "$OUT/interleaved" --compile \
  --heads 8192x3584x152064,8192x8192x152064 --budgets default,1536,2048,2432 --reps 20 \
  > "$OUT/interleaved.log" 2>&1
echo "interleaved: exit $?"
for mib in 1024 2048; do
  timeout -k 5 120 python3 -m suite kernel profile host --n 8192 --d 3584 --v 152064 \
    --softcap 0 --workspace-mib $mib --trace /tmp/t.json --csv "$OUT/profile.csv" \
    > "$OUT/n8192-d3584-ws$mib-profile.txt" 2>&1
  echo "profile ws$mib: exit $?"
done
python3 - "$OUT/interleaved/interleave.csv" <<'PY'
import csv, sys
for r in csv.DictReader(open(sys.argv[1])):
    print(" ".join(str(r.get(k, "")) for k in ("head", "budget", "entry", "chunks", "ms",
          "ms_p20", "ms_p80", "floors", "ms_over_compile", "peak_mib", "status")))
PY
for f in "$OUT"/*-profile.txt; do
  echo "== $f"; grep -A16 "GPU time by operation" "$f"; grep -B1 -A9 "span of" "$f" | head -10
done
