#!/usr/bin/env bash
# A tie-break between call25a/d (interleaved: the Gluon forward faster) and call25c/e (a
# process per provider, forward-only: level or slower): the forward inside loss+grad, where it
# follows the previous call's backward kernels as in training. The recompute path (budget 0)
# with the Gluon forward against the same path with the TMA one, a process per provider, two
# rounds: plain logits at Qwen 2.5 (7B)'s head (N 8192), then the softcap at Gemma 2 (9B)'s.
set -uo pipefail
export PYTHONUNBUFFERED=1
START=$SECONDS
DEADLINE=${DEADLINE:-280}
PYTHON=python3
source suite/kernel/deadline_steps.sh
start_run ${NAME:-recompute-fwd}
step "plain" python3 -m suite bench --plugin suite.frontier --phases loss+grad --dist lm \
  --n 8192 --d 3584 --v 152064 --softcap none --providers own_recompute,own_recompute@tma \
  --variant 'own_recompute@tma={"forward":{"ws":false}}' --rounds 2 --reps 20 \
  --out "$RUN/n8192-d3584-v152064" --quiet
step "softcap" python3 -m suite bench --plugin suite.frontier --phases loss+grad --dist lm \
  --n 8192 --d 3584 --v 256000 --softcap 30 --providers own_recompute,own_recompute@ws \
  --variant 'own_recompute@ws={"forward":{"ws_scaled_logits":true}}' --rounds 2 --reps 20 \
  --out "$RUN/n8192-d3584-v256000-sc30" --quiet
python3 - "$RUN" <<'PY'
import csv, glob, sys
for f in sorted(glob.glob(sys.argv[1] + "/n*/round-*/results.csv")):
    for r in csv.DictReader(open(f)):
        print(f.split("/")[-3], f.split("/")[-2], r["provider"], r["status"][:20], r["ms"],
              r["ms_p20"], r["ms_p80"], r["floor_ratio"])
PY
