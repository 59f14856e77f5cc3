#!/usr/bin/env bash
# After the recompute kernel's epilogue moved into _tile_grad (22bee03): the GPU tests of every
# autograd path and test_fused.py; then a second run of autocast at Gemma 2's three softcapped
# heads (the first: call22c.sh).
set -uo pipefail
export PYTHONUNBUFFERED=1
START=$SECONDS
DEADLINE=${DEADLINE:-570}
PYTHON=python3
source suite/kernel/deadline_steps.sh
start_run ${NAME:-tests-22d}
gpu_tests_step
capped_step "autocast softcapped" 200 python3 -m suite kernel autocast --out "$RUN/autocast-2" \
  --shapes gemma2-2b:8192:2304:256000:30,gemma2-9b:8192:3584:256000:30,gemma2-27b:8192:4608:256000:30 \
  --providers torch_compile,own,own_ws0 --budgets 2048,4096 --reps 20
python3 - "$RUN" <<'PY'
import csv, sys
for r in csv.DictReader(open(sys.argv[1] + "/autocast-2/autocast.csv")):
    print(r["shape"], r["provider"], r["status"][:30], r["path"], r["chunks"], r["ms"][:6],
          r["ms_p20"][:6], r["ms_p80"][:6], r["peak_mib"][:7], r["ms_over_compile"][:6],
          r["mib_over_compile"][:6])
PY
grep -E "passed|failed" $LOG | tail -2
