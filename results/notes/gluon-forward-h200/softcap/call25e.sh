#!/usr/bin/env bash
# After forward.ws_scaled_logits (off by default): the Gluon forward's GPU tests and the
# softcapped and temperature cases of test_correctness.py; then the plain Gluon forward against
# the TMA one a process per provider (call25c's method, which put the softcapped one level or
# slower where the interleave put it faster) at two plain heads: Llama 3 (8B) and Qwen 2.5 (7B).
set -uo pipefail
export PYTHONUNBUFFERED=1
START=$SECONDS
DEADLINE=${DEADLINE:-520}
PYTHON=python3
source suite/kernel/deadline_steps.sh
start_run ${NAME:-plain-fwd}
capped_step "gpu tests" 150 env CCE_TEST_DEVICE=cuda python3 -m pytest -q -rs -n 8 \
  -p no:cacheprovider tests/test_forward_ws.py tests/test_correctness.py \
  -k "ws or softcap or temperature"
grep -E "passed|failed" "$LOG" | tail -1
for head in 8192x4096x128256 16384x3584x152064; do
  IFS=x read -r n d v s <<< "$head"
  # shellcheck disable=SC2046  # head_args is words
  step "fwd $head" python3 -m suite bench --phases fwd --dist lm $(head_args "$head") \
    --providers own,own@tma --variant 'own@tma={"forward":{"ws":false}}' \
    --rounds 2 --reps 20 --out "$RUN/n$n-d$d-v$v" --quiet
done
python3 - "$RUN" <<'PY'
import csv, glob, sys
for f in sorted(glob.glob(sys.argv[1] + "/n*/round-*/results.csv")):
    for r in csv.DictReader(open(f)):
        print(f.split("/")[-3], f.split("/")[-2], r["provider"], r["status"][:20], r["ms"],
              r["ms_p20"], r["ms_p80"], r["floor_ratio"])
PY
