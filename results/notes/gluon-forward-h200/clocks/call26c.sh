#!/usr/bin/env bash
# The joules of a call (NVML's energy counter, read on an idle GPU before and after each call,
# new in --clocks): the Gluon and TMA forwards blocked at five plain heads; then the default
# loss+grad (1 GiB) beside torch.compile's at Llama 3 (8B) and D 1152, blocked and interleaved.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/.gpu/site
START=$SECONDS
DEADLINE=${DEADLINE:-540}
PYTHON=python3
source suite/kernel/deadline_steps.sh
start_run ${NAME:-clocks-c}
TMA='tma={"forward":{"ws":false}}'
HEADS=8192x3584x152064,8192x4096x128256,8192x5120x131072,16384x1152x262144,16384x3584x152064
capped_step "fwd blocked" 150 python3 -m suite kernel interleave --heads $HEADS --phase fwd \
  --variants "$TMA" --reps 40 --order blocked --clocks --out "$RUN/fwd-blocked"
for order in blocked interleaved; do
  capped_step "loss+grad $order" 120 python3 -m suite kernel interleave \
    --heads 8192x4096x128256,16384x1152x262144 --compile --reps 20 --order $order --clocks \
    --out "$RUN/lossgrad-$order"
done
python3 - "$RUN" <<'PY'
import csv, glob, sys
keys = ["head", "entry", "status", "path", "ms", "ms_p20", "ms_p80", "floors", "sm_mhz",
        "clock_limited", "j_per_call"]
print("run", *keys)
for f in sorted(glob.glob(sys.argv[1] + "/*/interleave.csv")):
    for r in csv.DictReader(open(f)):
        print(f.split("/")[-2], *(r[k] for k in keys))
PY
