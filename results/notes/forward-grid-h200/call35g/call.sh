#!/usr/bin/env bash
# call35g: forward.program_overhead_tiles 2 at four held-out grids it moves (none measured in
# call35a-c): N 4096, D 4608, V 152064 (21 splits to 8); N 4096, D 6144, V 200064 (25 to 12);
# N 5120, D 4096, V 131072 (17 to 13); N 5120, D 3584, V 49152 (13 to 6). The forward alone,
# interleaved, one process; with ORDER_ARGS="--order blocked --settle 12 --clocks" NAME=fwd-blocked,
# blocked and settled. Outputs tarred. Carry .gpu/site.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.gpu/site:$PWD
export CCE_BENCH_COMMIT=${CCE_BENCH_COMMIT:?the commit}
R=$(mktemp -d); mkdir -p "$OUT"
timeout -k 5 ${CAP_S:-150} python3 -m suite kernel interleave --phase fwd --reps 30 ${ORDER_ARGS:-} \
  --heads 4096x4608x152064,4096x6144x200064,5120x4096x131072,5120x3584x49152 \
  --variants 'ov2={"forward":{"program_overhead_tiles":2}}' --out "$R/${NAME:-fwd}" > "$R/${NAME:-fwd}.log" 2>&1
echo "fwd: exit $?"
tar -C "$R" -czf "$OUT/call35g.tgz" .
python3 - "$R/${NAME:-fwd}/interleave.csv" <<'PY'
import csv, sys
for r in csv.DictReader(open(sys.argv[1])):
    print(*(r.get(k, "") for k in ("head", "entry", "ms", "ms_p20", "ms_p80", "floors",
                                   "ms_over_base", "vs_base", "status")))
PY
