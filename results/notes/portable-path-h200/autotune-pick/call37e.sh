#!/usr/bin/env bash
# call37e: after call37d (the autotuner picks 128 x 256 x 64, 8 warps, 3 stages in all three
# processes, and no candidate beats it), tiles outside _PORTABLE_FORWARD_CANDIDATES and the
# cuBLAS forward (forward.cublas_min_d 0) beside the autotuned base, on the portable target, at
# N 16384, D 2048, V 49152 and Gemma 2 (2B)'s head (softcap 30): one process, interleaved
# sweeps, 30 reps. Carry .gpu/site.
set -u
export CCE_BENCH_COMMIT=cb610c8729c045edbc3a0c1a5e37edb721d8093f CCE_OWN_TARGET=portable
export PYTHONPATH=$PWD/.gpu/site:$PWD
t() { echo "$1={\"autotune\":false,\"forward\":{\"tiles\":{\"block_n\":$2,\"block_v\":$3,\"block_d\":$4,\"num_warps\":$5,\"num_stages\":$6}}}"; }
VARIANTS=("$(t t3 128 256 64 8 3)" "$(t u1 128 256 32 8 4)" "$(t u2 128 256 32 8 5)"
  "$(t u3 256 128 32 8 4)" "$(t u4 128 256 64 4 3)" "$(t u5 256 128 64 8 4)"
  "$(t u6 128 128 128 8 2)" 'cublas={"forward":{"cublas_min_d":0}}')
mkdir -p "$OUT"
CCE_OWN_TUNE_CACHE=$OUT/tiles.json timeout 300 python3 -m suite kernel interleave --out "$OUT" \
  --heads "${HEADS:-16384x2048x49152,8192x2304x256000x30}" --phase fwd --reps "${REPS:-30}" \
  --variants "${VARIANTS[@]}" > "$OUT/log.txt" 2>&1
echo "exit $?"
python3 -c "import csv
for r in csv.DictReader(open('$OUT/interleave.csv')):
    print(r['head'], r['entry'], r['status'][:40], r['path'], r['ms'], r['ms_p20'], r['ms_p80'], r['floors'], r['vs_base'])"
