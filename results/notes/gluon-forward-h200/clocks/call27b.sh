#!/usr/bin/env bash
# forward.ws_max_d 3072 checked at heads no preset names (926e499 chose it at the frontier's
# plain heads): blocked, 12 untimed calls before each block (--settle), two rounds. Below or at
# the limit (D 2048, D 3072) the default runs the Gluon forward, beside the TMA forward; above it
# (D 7168, D 8192) the default runs the TMA forward, beside the Gluon forward (ws_max_d 0: any D).
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/.gpu/site
START=$SECONDS
DEADLINE=${DEADLINE:-540}
PYTHON=python3
source suite/kernel/deadline_steps.sh
start_run ${NAME:-clocks-27b}
LOW=8192x2048x151936,8192x3072x32064
HIGH=8192x7168x129280,8192x8192x128256
for round in 1 2; do
  capped_step "at or below the limit ($round)" 120 python3 -m suite kernel interleave \
    --heads $LOW --phase fwd --variants 'tma={"forward":{"ws":false}}' --reps 40 \
    --order blocked --settle 12 --clocks --out "$RUN/low-$round"
  capped_step "above the limit ($round)" 150 python3 -m suite kernel interleave \
    --heads $HIGH --phase fwd --variants 'gluon={"forward":{"ws_max_d":0}}' --reps 40 \
    --order blocked --settle 12 --clocks --out "$RUN/high-$round"
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
print({k: env.get(k) for k in ("gpu_uuid", "power_limit_w", "sm_clock_max_mhz", "git_commit")})
PY
