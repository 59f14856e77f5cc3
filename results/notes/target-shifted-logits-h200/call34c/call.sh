#!/usr/bin/env bash
# call34c: on Hopper's own config, the target-shifted logits (cuBLAS GEMMs and the
# target-shifted pass, the portable path's) against its shifted logits (the TMA forward's), at
# budgets from the 1 GiB default up to one chunk within torch.compile's memory, interleaved in
# one process with torch.compile, at the shapes where Hopper misses 0.97x at torch.compile's
# memory (Qwen 2.5 (7B), D 5120) and two heads no preset names. call34a: at N 8192, D 3584,
# V 152064 the target-shifted pass takes 0.2 floors where torch.compile's kernels take 0.3.
# Carry .gpu/site.
set -u
export CCE_BENCH_COMMIT=${CCE_BENCH_COMMIT:?the commit}
export PYTHONPATH=$PWD/.gpu/site:$PWD
mkdir -p "$OUT"
TS='ts={"fused":{"logits_shifted":false,"target_shift":true,"target_shift_row_align":128}}'
timeout -k 5 420 python3 -m suite kernel interleave --out "$OUT/interleaved" --compile \
  --heads 16384x3584x152064,8192x5120x131072,8192x3584x152064,12288x3072x200064 \
  --budgets default,2048,2432,3072,4096,4864 --variants "$TS" --reps 20 \
  > "$OUT/interleaved.log" 2>&1
echo "interleaved: exit $?"
python3 - "$OUT/interleaved/interleave.csv" <<'PY'
import csv, sys
for r in csv.DictReader(open(sys.argv[1])):
    print(" ".join(str(r.get(k, "")) for k in ("head", "budget", "entry", "chunks", "ms",
          "ms_p20", "ms_p80", "floors", "ms_over_compile", "peak_mib", "status")))
PY
