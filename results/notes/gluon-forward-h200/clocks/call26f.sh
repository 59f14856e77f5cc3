#!/usr/bin/env bash
# call26b and d's blocked runs put the TMA forward's p80 far above its median (its first calls
# after a block of the Gluon forward's may run at that kernel's lower clock): blocked again with
# 12 untimed calls before each block (--settle), twice, at the four plain frontier heads and
# Qwen 2.5 (7B)'s at N 16384; and once without settling, beside them, on this call's board.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/.gpu/site
START=$SECONDS
DEADLINE=${DEADLINE:-420}
PYTHON=python3
source suite/kernel/deadline_steps.sh
start_run ${NAME:-clocks-f}
TMA='tma={"forward":{"ws":false}}'
HEADS=8192x3584x152064,8192x4096x128256,8192x5120x131072,16384x1152x262144,16384x3584x152064
i=0
for settle in 12 0 12; do
  i=$(( i + 1 ))
  capped_step "blocked settle $settle ($i)" 130 python3 -m suite kernel interleave \
    --heads $HEADS --phase fwd --variants "$TMA" --reps 40 --order blocked --settle $settle \
    --clocks --out "$RUN/fwd-$i-settle$settle"
done
python3 - "$RUN" <<'PY'
import csv, glob, json, sys
keys = ["head", "entry", "status", "ms", "ms_p20", "ms_p80", "floors", "sm_mhz",
        "clock_limited"]
print("run", *keys)
for f in sorted(glob.glob(sys.argv[1] + "/*/interleave.csv")):
    for r in csv.DictReader(open(f)):
        print(f.split("/")[-2], *(r[k] for k in keys))
env = json.load(open(sorted(glob.glob(sys.argv[1] + "/*/env.json"))[0]))
print({k: env.get(k) for k in ("gpu_uuid", "power_limit_w", "sm_clock_max_mhz")})
PY
