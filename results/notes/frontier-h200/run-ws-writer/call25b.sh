#!/usr/bin/env bash
# The frontier at gemma2-2b with the forward step, at the commit whose Gluon forward takes the
# softcap (a99d409; call25a: its GPU tests, 80 passed), then the Gluon forward at the same head
# without the softcap, interleaved with the softcapped one: what the tanh costs it. Carry
# .gpu/site and .torch-lce.
set -u
SHAPES="gemma2-2b" FORWARD=1 FRONTIER_DEADLINE_S=330 RUN=/tmp/run/frontier-c-h200 \
  bash suite/kernel/frontier_gpu.sh 2>&1 | grep -v "^$" | cut -c1-160 | tail -n 8
python3 -m suite kernel interleave --heads 8192x2304x256000,8192x2304x256000x30 --phase fwd \
  --reps 20 --out /tmp/run/frontier-c-h200/fwd-plain-vs-softcap > $OUT/plain-vs-softcap.log 2>&1
tar -C /tmp/run -cf $OUT/frontier-c-h200.tar frontier-c-h200
python3 - <<'PY'
import csv
for r in csv.DictReader(open("/tmp/run/frontier-c-h200/fwd-plain-vs-softcap/interleave.csv")):
    print(r["head"], r["entry"], r["status"][:30], r["ms"], r["ms_p20"], r["ms_p80"], r["floors"])
PY
