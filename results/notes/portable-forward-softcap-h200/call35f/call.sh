#!/usr/bin/env bash
# call35f: the portable forward at Gemma 2 (2B) (N 8192, D 2304, V 256000, softcap 30; 1.260
# floors in the frontier's process per provider, target 1.25), the portable target forced,
# blocked with the clock settled and the clocks read, beside torch.compile's forward, two
# processes. Outputs tarred. Carry .gpu/site.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.gpu/site:$PWD CCE_OWN_TARGET=portable
export CCE_BENCH_COMMIT=${CCE_BENCH_COMMIT:?the commit}
export CCE_OWN_TUNE_CACHE=$(mktemp -d)/tiles.json
R=$(mktemp -d); mkdir -p "$OUT"
for round in 1 2; do
  timeout -k 5 110 python3 -m suite kernel interleave --heads 8192x2304x256000x30 --phase fwd \
    --compile --reps 30 --order blocked --settle 12 --clocks --out "$R/round-$round" \
    > "$R/round-$round.log" 2>&1
  echo "round $round: exit $?"
done
tar -C "$R" -czf "$OUT/call35f.tgz" .
python3 - "$R" <<'PY'
import csv, glob, sys
keys = ["head", "entry", "ms", "ms_p20", "ms_p80", "floors", "ms_over_compile", "vs_compile",
        "sm_mhz", "status"]
for f in sorted(glob.glob(sys.argv[1] + "/*/interleave.csv")):
    print("==", f.split("/")[-2])
    for r in csv.DictReader(open(f)):
        print(*(r.get(k, "") for k in keys))
PY
