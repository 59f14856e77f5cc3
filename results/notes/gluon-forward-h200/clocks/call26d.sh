#!/usr/bin/env bash
# Where the two forwards cross in D: the Gluon and TMA forwards blocked (twice) and interleaved
# (once) at four plain heads no preset names, N 16384, D 1536-3072; then the four plain frontier
# heads at N 8192 blocked once more, on this call's board (env.json's gpu_uuid, new here).
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/.gpu/site
START=$SECONDS
DEADLINE=${DEADLINE:-540}
PYTHON=python3
source suite/kernel/deadline_steps.sh
start_run ${NAME:-clocks-d}
nvidia-smi --query-gpu=uuid,power.limit,clocks.max.sm,temperature.gpu --format=csv \
  > "$OUT/board.csv" 2>&1
TMA='tma={"forward":{"ws":false}}'
SWEEP=16384x1536x151936,16384x2048x128256,16384x2560x151936,16384x3072x128256
FRONTIER=8192x3584x152064,8192x4096x128256,8192x5120x131072,16384x1152x262144
i=0
for spec in "blocked $SWEEP" "interleaved $SWEEP" "blocked $SWEEP" "blocked $FRONTIER"; do
  read -r order heads <<< "$spec"
  i=$(( i + 1 ))
  capped_step "fwd $order $i" 110 python3 -m suite kernel interleave --heads "$heads" \
    --phase fwd --variants "$TMA" --reps 40 --order "$order" --clocks --out "$RUN/fwd-$i-$order"
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
