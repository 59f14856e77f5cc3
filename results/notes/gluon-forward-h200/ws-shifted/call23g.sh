#!/usr/bin/env bash
# The Gluon forward writing the three-matmul path's shifted logits (128-column tile maxima):
# its GPU tests first (a fault stops the call), then loss+grad interleaved against the TMA
# forward (forward.ws off) and torch.compile at two heads, then test_fused.py's GPU cases.
set -uo pipefail
export PYTHONUNBUFFERED=1
START=$SECONDS
DEADLINE=${DEADLINE:-400}
PYTHON=python3
source suite/kernel/deadline_steps.sh
start_run ${NAME:-ws-shifted}
TESTS_CAP_S=120 TEST_WORKERS=4 GPU_TESTS="tests/test_forward_ws.py" gpu_tests_step
grep -E "passed|failed" $LOG | tail -1
if [ "${STEP_RC:-1}" != 0 ]; then echo "ws tests failed: no timing"; exit 1; fi
TMA='{"forward":{"ws":false}}'
for head in 8192x4096x128256 8192x8192x152064; do
  capped_step "loss+grad $head" 95 python3 -m suite kernel interleave --heads $head \
    --budgets default,4096 --variants "tma=$TMA" --compile --reps 15 --out "$RUN/lg-$head"
done
TESTS_CAP_S=150 GPU_TESTS="tests/test_fused.py" gpu_tests_step
grep -E "passed|failed" $LOG | tail -1
python3 - "$RUN" <<'PY'
import csv, glob, sys
for f in sorted(glob.glob(sys.argv[1] + "/*/interleave.csv")):
    for r in csv.DictReader(open(f)):
        print(r["head"], r["entry"], r["status"][:30], r["path"], r["chunks"], r["ms"][:6],
              r["ms_p20"][:6], r["ms_p80"][:6], r["floors"][:5], r["ms_over_base"][:6],
              r["ms_over_compile"][:6], r["peak_mib"][:7], r["de_diff_vs_base"][:8],
              r["dc_diff_vs_base"][:8])
PY
