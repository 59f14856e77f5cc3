#!/usr/bin/env bash
# call35e: three standing judgements, blocked with the clock settled (12 untimed calls a block)
# and the clocks read, against torch.compile in the same process, two processes each:
# the 1 GiB default at N 8192, D 8192, V 152064 (slower in two interleaved runs of three);
# Qwen 2.5 (7B) at 3072 MiB (two chunks, its best point within torch.compile's memory: level,
# 0.988x, interleaved); budget 0 at N 4096, D 7168, V 129280 (4.158 floors interleaved).
# Outputs tarred (a fetch brings back few files). Carry .gpu/site.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.gpu/site:$PWD
export CCE_BENCH_COMMIT=${CCE_BENCH_COMMIT:?the commit}
R=$(mktemp -d); mkdir -p "$OUT"
step() {  # name cap heads budgets
  timeout -k 5 "$2" python3 -m suite kernel interleave --heads "$3" --budgets "$4" --compile \
    --reps 20 --order blocked --settle 12 --clocks --out "$R/$1" > "$R/$1.log" 2>&1
  echo "$1: exit $?"
}
for round in 1 2; do
  step "d8192-$round" 80 8192x8192x152064 default
  step "qwen-$round" 80 16384x3584x152064 3072
  step "d7168-ws0-$round" 60 4096x7168x129280 0
done
tar -C "$R" -czf "$OUT/call35e.tgz" .
python3 - "$R" <<'PY'
import csv, glob, sys
keys = ["head", "budget", "entry", "chunks", "ms", "ms_p20", "ms_p80", "floors",
        "ms_over_compile", "vs_compile", "peak_mib", "sm_mhz", "status"]
for f in sorted(glob.glob(sys.argv[1] + "/*/interleave.csv")):
    print("==", f.split("/")[-2])
    for r in csv.DictReader(open(f)):
        print(*(r.get(k, "") for k in keys))
PY
