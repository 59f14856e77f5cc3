#!/usr/bin/env bash
# Why own_portable at 8610198 (halves with a softcap, tiles tuned with them) took 1.34 floors at
# Gemma 2 (2B) where own_portable@h at 55235e9 (halves, tiles tuned without them) took 1.24:
# the tuned tiles with and without the halves, each timed with and without them.
set -uo pipefail
export PYTHONUNBUFFERED=1
export CCE_OWN_TUNE_CACHE=/tmp/tiles.json
mkdir -p $OUT
NH='own_portable@nh={"forward":{"softcap_halves":false}}'
run() { python3 -m suite bench --dist lm --phases fwd --preset gemma2-2b --dtype bf16 --reps 20 \
  --providers $1 --variant "$NH" --out "$OUT/$2" > "$OUT/$2.log" 2>&1; }
rm -f /tmp/tiles.json
run own_portable a1-halves-tuned; cp /tmp/tiles.json $OUT/tiles-tuned-with-halves.json
run own_portable@nh a2-nohalves-on-those
rm -f /tmp/tiles.json
run own_portable@nh b1-nohalves-tuned; cp /tmp/tiles.json $OUT/tiles-tuned-without.json
run own_portable b2-halves-on-those
for f in $OUT/*/results.csv; do python3 -c "
import csv,sys
for r in csv.DictReader(open('$f')): print('$f'.split('/')[-2], r['provider'], r['ms'][:6], r['ms_p20'][:6], r['ms_p80'][:6], r['floor_ratio'][:5])
"; done
cat $OUT/tiles-tuned-with-halves.json $OUT/tiles-tuned-without.json | grep -A8 forward | head -40
