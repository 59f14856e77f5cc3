#!/usr/bin/env bash
# The warp-specialised Gluon W writer (recompute.ws, on in hopper-16bit): its GPU tests and the
# paths' (CCE_TEST_DEVICE=cuda), then the recompute path at budget 0 with each writer, D 1152
# (where budget 0 keeps the recompute path) and three heads with the recompute path forced.
set -uo pipefail
export PYTHONUNBUFFERED=1
START=$SECONDS
DEADLINE=${DEADLINE:-570}
PYTHON=python3
source suite/kernel/deadline_steps.sh
start_run ${NAME:-ws-writer}
TESTS_CAP_S=300 GPU_TESTS="tests/test_dlogits_ws.py tests/test_forward_ws.py tests/test_correctness.py tests/test_autograd_paths.py" \
  gpu_tests_step
grep -E "passed|failed" $LOG | tail -2
TMA='{"recompute":{"ws":false}}'
capped_step "budget 0 8192x1152x262144" 60 python3 -m suite kernel interleave \
  --heads 8192x1152x262144 --budgets 0 --variants "tma=$TMA" --reps 15 --out "$RUN/b0-d1152"
RC='{"fused":{"zero_budget":"recompute"}}'
RC_TMA='{"recompute":{"ws":false},"fused":{"zero_budget":"recompute"}}'
for head in 8192x4096x128256 16384x2048x49152 4096x7168x129280; do
  capped_step "budget 0 $head" 60 python3 -m suite kernel interleave --heads $head --budgets 0 \
    --variants "rc=$RC" "rc_tma=$RC_TMA" --reps 15 --out "$RUN/b0-$head"
done
python3 - "$RUN" <<'PY'
import csv, glob, sys
for f in sorted(glob.glob(sys.argv[1] + "/*/interleave.csv")):
    for r in csv.DictReader(open(f)):
        print(r["head"], r["entry"], r["status"][:30], r["path"], r["chunks"], r["ms"][:6],
              r["ms_p20"][:6], r["ms_p80"][:6], r["floors"][:5], r["ms_over_base"][:6],
              r["peak_mib"][:7], r["de_diff_vs_base"][:8], r["dc_diff_vs_base"][:8])
PY
