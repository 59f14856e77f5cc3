#!/usr/bin/env bash
# A repeat of call23e's two-programs-per-SM split plan for the Gluon forward, 30 sweeps, at the
# heads where it had the lowest medians (D 7168, D 8192) and Llama 3 (8B)'s.
set -uo pipefail
export PYTHONUNBUFFERED=1
START=$SECONDS
DEADLINE=${DEADLINE:-200}
PYTHON=python3
source suite/kernel/deadline_steps.sh
start_run ${NAME:-ws-pps2}
PPS2='{"forward":{"programs_per_sm":2}}'
for head in 4096x7168x129280 8192x8192x152064 8192x4096x128256; do
  capped_step "fwd $head" 60 python3 -m suite kernel interleave --heads $head --phase fwd \
    --variants "pps2=$PPS2" --reps 30 --out "$RUN/fwd-$head"
done
python3 - "$RUN" <<'PY'
import csv, glob, sys
for f in sorted(glob.glob(sys.argv[1] + "/*/interleave.csv")):
    for r in csv.DictReader(open(f)):
        print(r["head"], r["entry"], r["status"][:30], r["ms"][:6], r["ms_p20"][:6],
              r["ms_p80"][:6], r["floor_ms"][:6], r["floors"][:5], r["ms_over_base"][:6])
PY
