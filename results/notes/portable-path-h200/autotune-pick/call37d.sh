#!/usr/bin/env bash
# call37d: is the portable forward's spread at N 16384, D 2048, V 49152 (1.135-1.336 floors in
# three runs) the autotuner's pick? Three processes, each with an empty tile cache
# (CCE_OWN_TUNE_CACHE), time the forward (phase fwd, interleaved sweeps, L2 flushed) on the
# portable target: the base autotunes its tiles on its first call (policy/autotune.py: median
# of 5 calls per candidate), and every candidate of _PORTABLE_FORWARD_CANDIDATES runs pinned
# (autotune off) beside it. Each process's cache file says what the base picked.
set -u
export CCE_BENCH_COMMIT=cb610c8729c045edbc3a0c1a5e37edb721d8093f CCE_OWN_TARGET=portable
export PYTHONPATH=$PWD/.gpu/site:$PWD
t() { echo "$1={\"autotune\":false,\"forward\":{\"tiles\":{\"block_n\":$2,\"block_v\":$3,\"block_d\":$4,\"num_warps\":$5,\"num_stages\":$6}}}"; }
VARIANTS=("$(t t0 64 128 32 4 3)" "$(t t1 128 128 32 4 3)" "$(t t2 128 128 64 8 3)"
  "$(t t3 128 256 64 8 3)" "$(t t4 128 128 64 4 4)" "$(t t5 64 256 64 8 4)"
  "$(t t6 128 256 64 8 4)" "$(t t7 256 128 64 8 3)")
for round in 1 2 3; do
  dir=$OUT/round-$round
  mkdir -p "$dir"
  CCE_OWN_TUNE_CACHE=$dir/tiles.json timeout 120 python3 -m suite kernel interleave \
    --out "$dir" --heads "${HEADS:-16384x2048x49152}" --phase fwd --reps "${REPS:-30}" \
    --variants "${VARIANTS[@]}" ${EXTRA:-} > "$dir/log.txt" 2>&1
  echo "round $round: exit $?"
  python3 -c "import json,sys; d=json.load(open('$dir/tiles.json')); print(json.dumps(d))" \
    2>&1 | cut -c1-300
done
for round in 1 2 3; do
  python3 -c "import csv; rows=list(csv.DictReader(open('$OUT/round-$round/interleave.csv')))
for r in rows: print($round, r.get('entry'), r.get('status'), r.get('ms'), r.get('ms_p20'), r.get('ms_p80'), r.get('floors'))" 2>&1 | head -12
done
