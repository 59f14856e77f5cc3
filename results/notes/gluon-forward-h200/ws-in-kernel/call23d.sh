#!/usr/bin/env bash
# The warp-specialised Gluon forward in the kernel (forward.ws, on in hopper-16bit): its GPU
# tests and the paths' (CCE_TEST_DEVICE=cuda), then its forward interleaved against the TMA
# forward (forward.ws off) and torch.compile at five heads, and the recompute path at budget 0
# with each forward beside the zero budget's default (three-matmul) at two heads.
set -uo pipefail
export PYTHONUNBUFFERED=1
START=$SECONDS
DEADLINE=${DEADLINE:-570}
PYTHON=python3
source suite/kernel/deadline_steps.sh
start_run ${NAME:-ws-in-kernel}
TESTS_CAP_S=250 GPU_TESTS="tests/test_forward_ws.py tests/test_correctness.py tests/test_autograd_paths.py" \
  gpu_tests_step
grep -E "passed|failed" $LOG | tail -2
TMA='{"forward":{"ws":false}}'
for head in 16384x2048x49152 4096x7168x129280 8192x4096x128256 8192x5120x131072 8192x8192x152064; do
  capped_step "fwd $head" 50 python3 -m suite kernel interleave --heads $head --phase fwd \
    --variants "tma=$TMA" --compile --reps 20 --out "$RUN/fwd-$head"
done
RC='{"fused":{"zero_budget":"recompute"}}'
RC_TMA='{"forward":{"ws":false},"fused":{"zero_budget":"recompute"}}'
for head in 4096x7168x129280 16384x2048x49152; do
  capped_step "budget 0 $head" 60 python3 -m suite kernel interleave --heads $head --budgets 0 \
    --variants "rc=$RC" "rc_tma=$RC_TMA" --reps 15 --out "$RUN/b0-$head"
done
python3 - "$RUN" <<'PY'
import csv, glob, sys
for f in sorted(glob.glob(sys.argv[1] + "/*/interleave.csv")):
    for r in csv.DictReader(open(f)):
        print(r["head"], r["entry"], r["status"][:30], r["path"], r["chunks"], r["ms"][:6],
              r["ms_p20"][:6], r["ms_p80"][:6], r["floors"][:5], r["ms_over_base"][:6],
              r["ms_over_compile"][:6], r["peak_mib"][:7], r["de_diff_vs_base"][:8])
PY
