#!/usr/bin/env bash
# Two re-checks in the device time left: the forward at Qwen 2.5 (7B), N 16384 (the frontier's
# forward step put the Gluon forward at 1.091 floors there), Gluon against TMA with the floor in
# the same sweeps; and the recompute path at budget 0, D 1152, with each W writer, more sweeps.
set -uo pipefail
export PYTHONUNBUFFERED=1
START=$SECONDS
DEADLINE=${DEADLINE:-200}
PYTHON=python3
source suite/kernel/deadline_steps.sh
start_run ${NAME:-recheck}
capped_step "fwd qwen" 70 python3 -m suite kernel interleave --heads 16384x3584x152064 \
  --phase fwd --variants 'tma={"forward":{"ws":false}}' --compile --reps 20 --out "$RUN/fwd-qwen"
capped_step "budget 0 d1152" 90 python3 -m suite kernel interleave --heads 8192x1152x262144 \
  --budgets 0 --variants 'tma={"recompute":{"ws":false}}' --reps 30 --out "$RUN/b0-d1152"
python3 - "$RUN" <<'PY'
import csv, glob, sys
for f in sorted(glob.glob(sys.argv[1] + "/*/interleave.csv")):
    for r in csv.DictReader(open(f)):
        print(r["head"], r["entry"], r["status"][:30], r["path"], r["ms"][:6], r["ms_p20"][:6],
              r["ms_p80"][:6], r["floors"][:5], r["ms_over_base"][:6], r["de_diff_vs_base"][:10])
PY
