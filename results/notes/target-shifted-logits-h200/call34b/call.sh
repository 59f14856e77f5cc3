#!/usr/bin/env bash
# call34b: the portable target forced, interleaved in one process with torch.compile, at the
# D 3584 heads where its 1 GiB default loses (call33b/c) and one where it is level: is the gap
# the process's clock, or the call? With it, the target-shifted pass's tiles (call34a: the pass
# runs at 3 of H200's ~4.8 TB/s) and chunk rows a multiple of 192 or 256 (cuBLAS's tiles there
# are 192 wide; 2816-row chunks leave a part tile). Carry .gpu/site.
set -u
export CCE_BENCH_COMMIT=${CCE_BENCH_COMMIT:?the commit}
export PYTHONPATH=$PWD/.gpu/site:$PWD CCE_OWN_TARGET=portable
mkdir -p "$OUT"
V=(
  't64={"fused":{"target_shift_tiles":[128,64,8,4]}}'
  'w4={"fused":{"target_shift_tiles":[128,32,4,8]}}'
  'p16={"fused":{"target_shift_tiles":[128,32,8,16]}}'
  'r64={"fused":{"target_shift_tiles":[64,64,4,8]}}'
  'ra192={"fused":{"target_shift_row_align":192}}'
  'ra256={"fused":{"target_shift_row_align":256}}'
)
timeout -k 5 330 python3 -m suite kernel interleave --out "$OUT/interleaved" --compile \
  --heads 8192x3584x152064,16384x3584x152064,12288x3072x200064 --variants "${V[@]}" \
  --reps 20 > "$OUT/interleaved.log" 2>&1
echo "interleaved: exit $?"
timeout -k 5 200 python3 -m suite kernel interleave --out "$OUT/blocked" --compile \
  --heads 8192x3584x152064,16384x3584x152064 --order blocked --settle 8 --clocks \
  --variants "${V[4]}" --reps 20 > "$OUT/blocked.log" 2>&1
echo "blocked: exit $?"
for f in interleaved blocked; do
  echo "== $f"; python3 - "$OUT/$f/interleave.csv" <<'PY'
import csv, sys
for r in csv.DictReader(open(sys.argv[1])):
    print(" ".join(str(r.get(k, "")) for k in ("head", "entry", "chunks", "ms", "ms_p20", "ms_p80",
          "floors", "ms_over_compile", "peak_mib", "sm_mhz", "status")))
PY
done
