#!/usr/bin/env bash
# call34e: the forward's L2 budget (forward.l2_mib, 24 MiB) at the row counts where it forces
# many splits in small launch groups. call34d: at N 8192, D 3584, V 152064 a 2048 MiB budget
# (two chunks of 4096 rows: 21 splits, groups of 7 row blocks) took the TMA forward 0.43 ms a
# call more than the 1 GiB default's three chunks (6 splits, one group), and the call was
# slower. 32 and 40 MiB, interleaved in one process: the forward alone at heads whose grid they
# change (and two they leave), then loss+grad with torch.compile. Carry .gpu/site.
set -u
export CCE_BENCH_COMMIT=${CCE_BENCH_COMMIT:?the commit}
export PYTHONPATH=$PWD/.gpu/site:$PWD
mkdir -p "$OUT"
V=('l2_32={"forward":{"l2_mib":32}}' 'l2_40={"forward":{"l2_mib":40}}')
timeout -k 5 200 python3 -m suite kernel interleave --out "$OUT/fwd" --phase fwd --reps 30 \
  --heads 4096x3584x152064,4096x7168x129280,4096x4096x128256,8192x8192x152064,16384x3584x152064,32768x2304x256000x30,8192x2304x256000x30,8192x5120x131072 \
  --variants "${V[@]}" > "$OUT/fwd.log" 2>&1
echo "fwd: exit $?"
timeout -k 5 300 python3 -m suite kernel interleave --out "$OUT/loss-grad" --compile --reps 20 \
  --heads 8192x3584x152064,4096x7168x129280,8192x8192x152064 --budgets default,2048 \
  --variants "${V[0]}" > "$OUT/loss-grad.log" 2>&1
echo "loss+grad: exit $?"
for f in fwd loss-grad; do
  echo "== $f"; python3 - "$OUT/$f/interleave.csv" <<'PY'
import csv, sys
for r in csv.DictReader(open(sys.argv[1])):
    print(" ".join(str(r.get(k, "")) for k in ("head", "budget", "entry", "chunks", "ms",
          "ms_p20", "ms_p80", "floors", "ms_over_base", "ms_over_compile", "status")))
PY
done
