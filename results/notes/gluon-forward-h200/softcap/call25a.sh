#!/usr/bin/env bash
# The Gluon forward with a softcap (and a temperature): its GPU tests, then the forward alone at
# Gemma 2's three softcapped heads, the Gluon forward against the TMA one (forward.ws off) and
# torch.compile, interleaved with the floor; then budget 0 at Gemma 2 (2B), whose recompute
# path now starts with the Gluon forward.
set -uo pipefail
export PYTHONUNBUFFERED=1
START=$SECONDS
DEADLINE=${DEADLINE:-520}
PYTHON=python3
source suite/kernel/deadline_steps.sh
start_run ${NAME:-softcap}
capped_step "gpu tests" 200 env CCE_TEST_DEVICE=cuda python3 -m pytest -q -rs -n 8 \
  -p no:cacheprovider tests/test_forward_ws.py tests/test_dlogits_ws.py \
  tests/test_correctness.py tests/test_autograd_paths.py tests/test_entropy.py \
  -k "ws or softcap or temperature"
grep -E "passed|failed" "$LOG" | tail -2
TMA='tma={"forward":{"ws":false}}'
capped_step "fwd gemma2" 150 python3 -m suite kernel interleave \
  --heads 8192x2304x256000x30,8192x3584x256000x30,8192x4608x256000x30 \
  --phase fwd --variants "$TMA" --compile --reps 20 --out "$RUN/fwd-gemma2"
capped_step "budget 0 gemma2-2b" 100 python3 -m suite kernel interleave \
  --heads 8192x2304x256000x30 --budgets 0 --variants "$TMA" --reps 20 --out "$RUN/b0-gemma2-2b"
python3 - "$RUN" <<'PY'
import csv, glob, sys
for f in sorted(glob.glob(sys.argv[1] + "/*/interleave.csv")):
    for r in csv.DictReader(open(f)):
        print(r["head"], r["entry"], r["status"][:30], r["path"], r["ms"], r["ms_p20"],
              r["ms_p80"], r["floors"], r["ms_over_base"], r["de_diff_vs_base"])
PY
