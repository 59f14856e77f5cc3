#!/usr/bin/env bash
# call38a: where the portable pointer forward's time goes, per SASS instruction, at the head
# where it misses 1.25 floors (N 16384, D 2048, V 49152) and at the D 1152 head where it meets
# it (N 16384, D 1152, V 262144): ncu (--clock-control none) with source counters over one
# launch of the cuBLAS floor (nvjet) and one of the pointer forward at the autotuner's pick
# (128 x 256 x 64, 8 warps, 3 stages, pinned, autotune off), plain logits; then the forward's
# flattened tile loop (forward.flatten, never tried on this kernel) beside the default,
# interleaved, at three heads. Carry .gpu/site.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.gpu/site:$PWD CCE_OWN_TARGET=portable
PIN='"autotune":false,"forward":{"tiles":{"block_n":128,"block_v":256,"block_d":64,"num_warps":8,"num_stages":3}'
mkdir -p "$OUT"
ncu --version | tail -1
for head in 16384x2048x49152 16384x1152x262144; do
  IFS=x read -r n d v <<< "$head"
  CCE_OWN_CONFIG="{$PIN}}" timeout -k 5 150 ncu --clock-control none \
    -k regex:"cce_fwd_kernel|nvjet" --launch-count 2 --section SpeedOfLight \
    --section WarpStateStats --section SourceCounters --section LaunchStats \
    --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active \
    -o "$OUT/fwd-$head" python3 -m suite kernel profile fwd --n "$n" --d "$d" --v "$v" \
    --softcap 0 > "$OUT/ncu-$head.log" 2>&1
  echo "ncu $head: exit $?"
  ncu -i "$OUT/fwd-$head.ncu-rep" --page source --csv --print-source sass \
    -k cce_fwd_kernel > "$OUT/sass-$head.csv" 2> "$OUT/sass-$head.err"
  echo "source page $head: exit $? $(wc -l < "$OUT/sass-$head.csv") lines"
  ncu -i "$OUT/fwd-$head.ncu-rep" --page details --csv > "$OUT/details-$head.csv" 2>&1
done
CCE_OWN_TUNE_CACHE=$OUT/tiles.json timeout 240 python3 -m suite kernel interleave \
  --out "$OUT/flatten" --heads 16384x2048x49152,16384x1152x262144,8192x1536x151936 \
  --phase fwd --reps 30 --variants "pin={$PIN}}" "flat={$PIN,\"flatten\":true}}" \
  > "$OUT/flatten-log.txt" 2>&1
echo "interleave: exit $?"
python3 -c "import csv
for r in csv.DictReader(open('$OUT/flatten/interleave.csv')):
    print(r['head'], r['entry'], r['status'][:40], r['ms'], r['ms_p20'], r['ms_p80'], r['floors'], r['vs_base'])"
cd "$OUT" && tar czf call38a.tgz --exclude=call38a.tgz . && ls -la call38a.tgz
