#!/usr/bin/env bash
# call35b: forward.program_overhead_tiles 2 (call35a, interleaved: the forward faster at
# N 4096, D 3584, V 152064 and level at every other forward and loss+grad cell), blocked with
# the clock settled, two rounds, at the three grids it moves and one it does not; loss+grad at
# N 4096, D 3584, V 152064 interleaved with torch.compile; then the batch-invariance tests on
# the GPU with the override (cut at 100 s in call35a). Carry .gpu/site.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.gpu/site:$PWD
export CCE_BENCH_COMMIT=${CCE_BENCH_COMMIT:?the commit}
mkdir -p "$OUT"
OV='ov2={"forward":{"program_overhead_tiles":2}}'
HEADS=4096x3584x152064,4096x7168x129280,8192x5120x131072,16384x4096x128256
for round in 1 2; do
  timeout -k 5 110 python3 -m suite kernel interleave --heads $HEADS --phase fwd \
    --variants "$OV" --reps 30 --order blocked --settle 12 --clocks \
    --out "$OUT/fwd-blocked-$round" > "$OUT/fwd-blocked-$round.log" 2>&1
  echo "fwd blocked $round: exit $?"
done
timeout -k 5 90 python3 -m suite kernel interleave --out "$OUT/loss-grad" --compile --reps 20 \
  --heads 4096x3584x152064 --budgets default,2048 --variants "$OV" \
  > "$OUT/loss-grad.log" 2>&1
echo "loss+grad: exit $?"
CCE_OWN_CONFIG='{"forward":{"program_overhead_tiles":2}}' CCE_TEST_DEVICE=cuda \
  timeout -k 5 170 python3 -m pytest -q -rs -n 8 -p no:cacheprovider \
  tests/test_batch_invariant.py > "$OUT/gpu-tests.log" 2>&1
echo "gpu tests: exit $?"; tail -n 2 "$OUT/gpu-tests.log"
python3 - "$OUT" <<'PY'
import csv, glob, sys
keys = ["head", "budget", "entry", "chunks", "ms", "ms_p20", "ms_p80", "floors", "vs_base",
        "vs_compile", "sm_mhz", "status"]
for f in sorted(glob.glob(sys.argv[1] + "/*/interleave.csv")):
    print("==", f.split("/")[-2])
    for r in csv.DictReader(open(f)):
        print(*(r.get(k, "") for k in keys))
PY
