#!/usr/bin/env bash
# Whether the two methods' disagreement about the Gluon and TMA forwards is the SM clock: each
# forward, and the floor, timed interleaved and blocked (each entry's calls back to back) in one
# process, with the SM clock, power and NVML's clock-limiting reasons read while each call runs
# (`--clocks`, pynvml from .gpu/site). Two plain heads at N 16384 (Qwen 2.5 (7B), where a process
# per provider put the Gluon forward slower, and Llama 3 (8B)), each order twice. Before them, the
# Gluon forward's GPU tests, with a one-row call (n 1, which Triton makes a constexpr).
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/.gpu/site
START=$SECONDS
DEADLINE=${DEADLINE:-540}
PYTHON=python3
source suite/kernel/deadline_steps.sh
start_run ${NAME:-clocks}
nvidia-smi -q -d POWER,CLOCK,PERFORMANCE,TEMPERATURE > "$OUT/smi-before.txt" 2>&1
GPU_TESTS="tests/test_forward_ws.py" TEST_WORKERS=4 TESTS_CAP_S=150 gpu_tests_step
TMA='tma={"forward":{"ws":false}}'
HEADS=16384x3584x152064,16384x4096x128256
for order in interleaved blocked interleaved blocked; do
  i=$(( ${i:-0} + 1 ))
  capped_step "$order $i" 100 python3 -m suite kernel interleave --heads $HEADS --phase fwd \
    --variants "$TMA" --reps 40 --order $order --clocks --out "$RUN/$i-$order"
done
nvidia-smi -q -d POWER,CLOCK,PERFORMANCE,TEMPERATURE > "$OUT/smi-after.txt" 2>&1
python3 - "$RUN" <<'PY'
import csv, glob, sys
keys = ["head", "entry", "status", "ms", "ms_p20", "ms_p80", "floors", "sm_mhz", "power_w",
        "clock_limited", "clock_reasons"]
print("run", *keys)
for f in sorted(glob.glob(sys.argv[1] + "/*/interleave.csv")):
    for r in csv.DictReader(open(f)):
        print(f.split("/")[-2], *(r[k] for k in keys))
PY
