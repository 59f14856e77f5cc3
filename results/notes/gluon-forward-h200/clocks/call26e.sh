#!/usr/bin/env bash
# `suite bench --clocks` on the GPU: test_clocks.py's GPU case (a real NVML read) and a two-round
# bench of the default and torch.compile, a process per provider, each row with its SM clock.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/.gpu/site
START=$SECONDS
DEADLINE=${DEADLINE:-300}
PYTHON=python3
source suite/kernel/deadline_steps.sh
start_run ${NAME:-bench-clocks}
GPU_TESTS="tests/test_clocks.py" TEST_WORKERS=1 TESTS_CAP_S=90 gpu_tests_step
capped_step "bench" 200 python3 -m suite bench --dist lm --phases fwd,loss+grad --n 8192 \
  --d 4096 --v 128256 --softcap none --dtype bf16 --providers own,torch_compile --rounds 2 \
  --reps 10 --clocks --quiet --out "$RUN/bench"
python3 - "$RUN" <<'PY'
import csv, glob, sys
keys = ["provider", "phase", "status", "ms", "ms_p20", "ms_p80", "floor_ratio", "sm_mhz",
        "clock_limited"]
print("round", *keys)
for f in sorted(glob.glob(sys.argv[1] + "/bench/round-*/results.csv")):
    for r in csv.DictReader(open(f)):
        print(f.split("/")[-2], *(r[k] for k in keys))
PY
