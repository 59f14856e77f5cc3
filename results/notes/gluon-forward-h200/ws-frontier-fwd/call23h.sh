#!/usr/bin/env bash
# The Gluon forward (forward.ws) at the frontier's two other shapes without a softcap, D 1152,
# V 262144 and Qwen 2.5 (7B), forward-only against the TMA forward and torch.compile.
set -uo pipefail
export PYTHONUNBUFFERED=1
START=$SECONDS
DEADLINE=${DEADLINE:-150}
PYTHON=python3
source suite/kernel/deadline_steps.sh
start_run ${NAME:-ws-frontier-fwd}
TMA='{"forward":{"ws":false}}'
for head in 8192x1152x262144 8192x3584x152064; do
  capped_step "fwd $head" 60 python3 -m suite kernel interleave --heads $head --phase fwd \
    --variants "tma=$TMA" --compile --reps 20 --out "$RUN/fwd-$head"
done
python3 - "$RUN" <<'PY'
import csv, glob, sys
for f in sorted(glob.glob(sys.argv[1] + "/*/interleave.csv")):
    for r in csv.DictReader(open(f)):
        print(r["head"], r["entry"], r["status"][:30], r["ms"][:6], r["ms_p20"][:6],
              r["ms_p80"][:6], r["floor_ms"][:6], r["floors"][:5], r["ms_over_base"][:6],
              r["ms_over_compile"][:6])
PY
