#!/usr/bin/env bash
# call35a: forward.program_overhead_tiles 2 (fewer splits in larger launch groups at three
# grids: N 4096, D 3584, V 152064; N 4096, D 7168, V 129280; N 8192, D 5120, V 131072),
# the forward alone interleaved with the default at those and at two control heads it does
# not move; then loss+grad with torch.compile where it moves a chunk's grid (the 2 GiB plan
# at N 8192, D 3584, V 152064 runs chunks of 4096 rows); then the batch-invariance tests on
# the GPU with the override. Carry .gpu/site.
set -u
export CCE_BENCH_COMMIT=${CCE_BENCH_COMMIT:?the commit}
export PYTHONPATH=$PWD/.gpu/site:$PWD
mkdir -p "$OUT"
OV='ov2={"forward":{"program_overhead_tiles":2}}'
timeout -k 5 170 python3 -m suite kernel interleave --out "$OUT/fwd" --phase fwd --reps 30 \
  --heads 4096x3584x152064,4096x7168x129280,8192x5120x131072,8192x2304x256000x30,16384x4096x128256 \
  --variants "$OV" > "$OUT/fwd.log" 2>&1
echo "fwd: exit $?"
timeout -k 5 250 python3 -m suite kernel interleave --out "$OUT/loss-grad" --compile --reps 20 \
  --heads 8192x3584x152064,8192x5120x131072,4096x7168x129280 --budgets default,2048 \
  --variants "$OV" > "$OUT/loss-grad.log" 2>&1
echo "loss+grad: exit $?"
CCE_OWN_CONFIG='{"forward":{"program_overhead_tiles":2}}' CCE_TEST_DEVICE=cuda \
  timeout -k 5 100 python3 -m pytest -q -rs -n 8 -p no:cacheprovider \
  tests/test_batch_invariant.py > "$OUT/gpu-tests.log" 2>&1
echo "gpu tests: exit $?"; tail -n 2 "$OUT/gpu-tests.log"
for f in fwd loss-grad; do
  echo "== $f"; python3 - "$OUT/$f/interleave.csv" <<'PY'
import csv, sys
for r in csv.DictReader(open(sys.argv[1])):
    print(" ".join(str(r.get(k, "")) for k in ("head", "budget", "entry", "chunks", "ms",
          "ms_p20", "ms_p80", "floors", "ms_over_base", "ms_over_compile", "status")))
PY
done
