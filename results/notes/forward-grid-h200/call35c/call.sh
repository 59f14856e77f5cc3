#!/usr/bin/env bash
# call35c: forward.program_overhead_tiles 2 at the other grids it moves on 132 SMs (call35a-b
# measured three): N 1024 and 2048 and 4096 at D 8192, V 152064; N 1024, D 3584, V 152064;
# N 6144, D 1152, V 32000; N 12288, D 4096, V 32000. The forward alone, interleaved and then
# blocked with the clock settled; loss+grad at N 8192, D 8192, V 152064 with torch.compile.
# Outputs tarred (a fetch brings back few files). Carry .gpu/site.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.gpu/site:$PWD
export CCE_BENCH_COMMIT=${CCE_BENCH_COMMIT:?the commit}
R=$(mktemp -d); mkdir -p "$OUT"
OV='ov2={"forward":{"program_overhead_tiles":2}}'
HEADS=4096x8192x152064,2048x8192x152064,1024x8192x152064,1024x3584x152064,6144x1152x32000,12288x4096x32000
timeout -k 5 110 python3 -m suite kernel interleave --heads $HEADS --phase fwd \
  --variants "$OV" --reps 30 --out "$R/fwd" > "$R/fwd.log" 2>&1
echo "fwd interleaved: exit $?"
timeout -k 5 130 python3 -m suite kernel interleave --heads $HEADS --phase fwd \
  --variants "$OV" --reps 30 --order blocked --settle 12 --clocks \
  --out "$R/fwd-blocked" > "$R/fwd-blocked.log" 2>&1
echo "fwd blocked: exit $?"
timeout -k 5 110 python3 -m suite kernel interleave --out "$R/loss-grad" --compile --reps 20 \
  --heads 8192x8192x152064 --variants "$OV" > "$R/loss-grad.log" 2>&1
echo "loss+grad: exit $?"
tar -C "$R" -czf "$OUT/call35c.tgz" .
python3 - "$R" <<'PY'
import csv, glob, sys
keys = ["head", "budget", "entry", "chunks", "ms", "ms_p20", "ms_p80", "floors", "vs_base",
        "vs_compile", "sm_mhz", "status"]
for f in sorted(glob.glob(sys.argv[1] + "/*/interleave.csv")):
    print("==", f.split("/")[-2])
    for r in csv.DictReader(open(f)):
        print(*(r.get(k, "") for k in keys))
PY
