#!/usr/bin/env bash
# call37f: call37e's cuBLAS forward (forward.cublas_min_d 0) against the autotuned pointer
# forward on the portable target, blocked (each entry's calls back to back after 3 untimed
# ones, --clocks), at call37e's two heads and N 8192, D 1536, V 151936: the interleaved
# sweeps can favour a kernel that draws less power (gluon-forward.md). Carry .gpu/site.
set -u
export CCE_BENCH_COMMIT=cb610c8729c045edbc3a0c1a5e37edb721d8093f CCE_OWN_TARGET=portable
export PYTHONPATH=$PWD/.gpu/site:$PWD
mkdir -p "$OUT"
CCE_OWN_TUNE_CACHE=$OUT/tiles.json timeout 200 python3 -m suite kernel interleave --out "$OUT" \
  --heads 16384x2048x49152,8192x2304x256000x30,8192x1536x151936 --phase fwd --reps 30 \
  --order blocked --settle 3 --clocks --variants 'cublas={"forward":{"cublas_min_d":0}}' \
  > "$OUT/log.txt" 2>&1
echo "exit $?"
python3 -c "import csv
for r in csv.DictReader(open('$OUT/interleave.csv')):
    print(r['head'], r['entry'], r['status'][:40], r['ms'], r['ms_p20'], r['ms_p80'], r['floors'], r['vs_base'], r['sm_mhz'], r['power_w'])"
