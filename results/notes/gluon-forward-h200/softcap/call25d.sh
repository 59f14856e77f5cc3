#!/usr/bin/env bash
# Why call25a (interleaved in one process) put the TMA forward 1.5-2.5 ms slower than call25c
# (a process per provider) did, while the Gluon forward's times agreed: each head's base (no
# override), the same config as an override (`ws`: forward.ws true, the base's own kernel) and
# the TMA forward (`tma`), interleaved; and the order of the entries reversed (`--variants` in
# the other order). A softcapped head and a plain one.
set -uo pipefail
export PYTHONUNBUFFERED=1
START=$SECONDS
DEADLINE=${DEADLINE:-300}
PYTHON=python3
source suite/kernel/deadline_steps.sh
start_run ${NAME:-override-check}
WS='ws={"forward":{"ws":true}}'
TMA='tma={"forward":{"ws":false}}'
capped_step "a" 90 python3 -m suite kernel interleave --heads 8192x3584x256000x30,8192x4096x128256 \
  --phase fwd --variants "$WS" "$TMA" --reps 20 --out "$RUN/a"
capped_step "b" 90 python3 -m suite kernel interleave --heads 8192x3584x256000x30,8192x4096x128256 \
  --phase fwd --variants "$TMA" "$WS" --reps 20 --out "$RUN/b"
python3 - "$RUN" <<'PY'
import csv, glob, sys
for f in sorted(glob.glob(sys.argv[1] + "/*/interleave.csv")):
    for r in csv.DictReader(open(f)):
        print(f.split("/")[-2], r["head"], r["entry"], r["status"][:30], r["ms"], r["ms_p20"],
              r["ms_p80"], r["floors"])
PY
