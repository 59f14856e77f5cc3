#!/usr/bin/env bash
# forward.ws_max_d 3072 (the TMA forward above it): the Gluon forward's GPU tests (the route's
# D limit among them), then the frontier's forward step (frontier_gpu.sh's, a process per cell,
# with --clocks) at its three plain shapes with a D above the limit.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:$PWD/.gpu/site
START=$SECONDS
DEADLINE=${DEADLINE:-230}
PYTHON=python3
source suite/kernel/deadline_steps.sh
start_run ${NAME:-forward-ws-max-d}
GPU_TESTS="tests/test_forward_ws.py" TEST_WORKERS=4 TESTS_CAP_S=80 gpu_tests_step
for cell in "--preset llama3-8b" "--preset qwen25-7b" "--preset llama3-8b --n 8192 --d 5120 --v 131072"; do
  # shellcheck disable=SC2086
  step "forward $cell" python3 -m suite bench --dist lm --phases fwd --isolate --reps 10 \
    --dtype bf16 --providers own,own_portable,torch_compile $cell --clocks \
    --out "$RUN/forward-$GPU" --resume --quiet
done
python3 - "$RUN" <<'PY'
import csv, glob, json, sys
keys = ["n", "d", "v", "provider", "status", "ms", "ms_p20", "ms_p80", "floor_ratio", "sm_mhz",
        "clock_limited", "ran"]
print(*keys)
for f in sorted(glob.glob(sys.argv[1] + "/forward-*/results.csv")):
    for r in csv.DictReader(open(f)):
        print(*(r[k] for k in keys))
    env = json.load(open(f.replace("results.csv", "env.json")))
    print({k: env.get(k) for k in ("gpu_uuid", "git_commit")})
PY
