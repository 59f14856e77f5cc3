#!/usr/bin/env bash
# call34f: a second process for forward.l2_mib 32 (call34e: faster at N 4096, D 3584,
# V 152064, level at seven heads), at the frontier's and the softcapped heads whose grid it
# changes, the forward alone and loss+grad with torch.compile, interleaved; then the
# batch-invariance tests on the GPU with the override (its forward groups row blocks by the
# same budget). Carry .gpu/site.
set -u
export CCE_BENCH_COMMIT=${CCE_BENCH_COMMIT:?the commit}
export PYTHONPATH=$PWD/.gpu/site:$PWD
mkdir -p "$OUT"
L2='l2_32={"forward":{"l2_mib":32}}'
timeout -k 5 150 python3 -m suite kernel interleave --out "$OUT/fwd" --phase fwd --reps 30 \
  --heads 4096x3584x152064,16384x4096x128256,8192x3584x152064,8192x3584x256000x30,8192x4608x256000x30,16384x2560x100352,4096x7168x129280 \
  --variants "$L2" > "$OUT/fwd.log" 2>&1
echo "fwd: exit $?"
timeout -k 5 260 python3 -m suite kernel interleave --out "$OUT/loss-grad" --compile --reps 20 \
  --heads 16384x4096x128256,16384x2048x49152,8192x3584x256000x30 --budgets default,4096 \
  --variants "$L2" > "$OUT/loss-grad.log" 2>&1
echo "loss+grad: exit $?"
CCE_OWN_CONFIG='{"forward":{"l2_mib":32}}' CCE_TEST_DEVICE=cuda timeout -k 5 100 \
  python3 -m pytest -q -rs -n 8 -p no:cacheprovider tests/test_batch_invariant.py \
  > "$OUT/gpu-tests.log" 2>&1
echo "gpu tests: exit $?"; tail -n 2 "$OUT/gpu-tests.log"
for f in fwd loss-grad; do
  echo "== $f"; python3 - "$OUT/$f/interleave.csv" <<'PY'
import csv, sys
for r in csv.DictReader(open(sys.argv[1])):
    print(" ".join(str(r.get(k, "")) for k in ("head", "budget", "entry", "chunks", "ms",
          "ms_p20", "ms_p80", "floors", "ms_over_base", "ms_over_compile", "status")))
PY
done
