#!/usr/bin/env bash
# call36e: the launch-order plan (the default; forward.short_split_last off) against the
# split-order one (`old`). Loss+grad with torch.compile in one process (interleaved, 20 sweeps)
# at the two N 16384, V 128256 heads where call36d's forward was faster blocked; then the forward
# alone, blocked and settled, at four grids it moves that no call has measured. Outputs tarred.
# Carry .gpu/site.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.gpu/site:$PWD
export CCE_BENCH_COMMIT=${CCE_BENCH_COMMIT:?the commit}
R=$(mktemp -d); mkdir -p "$OUT"
OLD='old={"forward":{"makespan_order":"split"}}'
timeout -k 5 ${CAP_S:-200} python3 -m suite kernel interleave --compile --reps 20 \
  --heads 16384x3072x128256,16384x3584x128256 --variants "$OLD" --out "$R/loss-grad" \
  > "$R/loss-grad.log" 2>&1
echo "loss+grad: exit $?"
tar -C "$R" -czf "$OUT/call36e.tgz" .
timeout -k 5 ${CAP2_S:-200} python3 -m suite kernel interleave --phase fwd --reps 20 \
  --order blocked --settle 12 --clocks --variants "$OLD" \
  --heads 8192x3584x131072,16384x3072x49152,5120x4096x32000,5120x6144x32000 \
  --out "$R/fwd-blocked" > "$R/fwd-blocked.log" 2>&1
echo "fwd-blocked: exit $?"
tar -C "$R" -czf "$OUT/call36e.tgz" .
for f in loss-grad fwd-blocked; do
  python3 - "$R/$f/interleave.csv" <<'PY'
import csv, sys
for r in csv.DictReader(open(sys.argv[1])):
    print(*(r.get(k, "") for k in ("head", "entry", "chunks", "ms", "ms_p20", "ms_p80", "floors",
                                   "ms_over_base", "vs_base", "ms_over_compile", "vs_compile",
                                   "status", "sm_mhz")))
PY
done
