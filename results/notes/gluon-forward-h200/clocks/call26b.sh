#!/usr/bin/env bash
# call26a found every forward call at the H200's power cap, the Gluon forward clocked lower than
# the TMA one when each follows itself (blocked) and both at the mix's clock interleaved. Here:
# the forward blocked at the four plain frontier heads (Qwen 2.5 (7B), Llama 3 (8B), D 5120,
# D 1152), twice, and interleaved once; then the recompute path's loss+grad at a zero budget at
# D 1152 (both Gluon kernels) against the TMA forward, the TMA writer and both, blocked, twice.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/.gpu/site
START=$SECONDS
DEADLINE=${DEADLINE:-540}
PYTHON=python3
source suite/kernel/deadline_steps.sh
start_run ${NAME:-clocks-b}
TMA='tma={"forward":{"ws":false}}'
HEADS=8192x3584x152064,8192x4096x128256,8192x5120x131072,16384x1152x262144
i=0
for order in blocked interleaved blocked; do
  i=$(( i + 1 ))
  capped_step "fwd $order $i" 110 python3 -m suite kernel interleave --heads $HEADS --phase fwd \
    --variants "$TMA" --reps 40 --order $order --clocks --out "$RUN/fwd-$i-$order"
done
for i in 1 2; do
  capped_step "zero budget blocked $i" 100 python3 -m suite kernel interleave \
    --heads 16384x1152x262144 --budgets 0 --variants "$TMA" \
    'writer_tma={"recompute":{"ws":false}}' \
    'both_tma={"forward":{"ws":false},"recompute":{"ws":false}}' \
    --reps 20 --order blocked --clocks --out "$RUN/zero-$i-blocked"
done
python3 - "$RUN" <<'PY'
import csv, glob, sys
keys = ["head", "entry", "status", "path", "ms", "ms_p20", "ms_p80", "floors", "sm_mhz",
        "clock_limited", "clock_reasons"]
print("run", *keys)
for f in sorted(glob.glob(sys.argv[1] + "/*/interleave.csv")):
    for r in csv.DictReader(open(f)):
        print(f.split("/")[-2], *(r[k] for k in keys))
PY
