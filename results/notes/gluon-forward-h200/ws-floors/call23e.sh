#!/usr/bin/env bash
# The Gluon forward (forward.ws) against the TMA forward with the floor timed in the same sweeps
# (interleave since this commit), and with two programs per SM in the split plan; then the
# zero budget at D 1152, V 262144, which keeps the recompute path (its forward: ws or tma).
set -uo pipefail
export PYTHONUNBUFFERED=1
START=$SECONDS
DEADLINE=${DEADLINE:-400}
PYTHON=python3
source suite/kernel/deadline_steps.sh
start_run ${NAME:-ws-floors}
TMA='{"forward":{"ws":false}}'
PPS2='{"forward":{"programs_per_sm":2}}'
for head in 16384x2048x49152 4096x7168x129280 8192x4096x128256 8192x5120x131072 8192x8192x152064; do
  capped_step "fwd $head" 50 python3 -m suite kernel interleave --heads $head --phase fwd \
    --variants "tma=$TMA" "pps2=$PPS2" --compile --reps 20 --out "$RUN/fwd-$head"
done
capped_step "budget 0 8192x1152x262144" 80 python3 -m suite kernel interleave \
  --heads 8192x1152x262144 --budgets 0 --variants "tma=$TMA" --compile --reps 15 \
  --out "$RUN/b0-8192x1152x262144"
python3 - "$RUN" <<'PY'
import csv, glob, sys
for f in sorted(glob.glob(sys.argv[1] + "/*/interleave.csv")):
    for r in csv.DictReader(open(f)):
        print(r["head"], r["entry"], r["status"][:30], r["path"], r["chunks"], r["ms"][:6],
              r["ms_p20"][:6], r["ms_p80"][:6], r["floor_ms"][:6], r["floors"][:5],
              r["ms_over_base"][:6], r["ms_over_compile"][:6], r["peak_mib"][:7])
PY
