#!/usr/bin/env bash
# call19b's Gemma 2 (2B) softcap-30 step again at 8610198 (halves on by default in PORTABLE,
# with a softcap): does 55235e9's 1.24 floors repeat? Two rounds, one process per provider.
set -uo pipefail
export PYTHONUNBUFFERED=1
mkdir -p $OUT
T='"autotune":false,"fused":{"block":2048},"forward":{"tiles":{"block_d":64,"block_n":128,"block_v":256,"num_warps":8,"num_stages":3}'
timeout 280 python3 -m suite bench --dist lm --phases fwd --n 8192 --d 2304 --v 256000 --softcap 30 \
  --dtype bf16 --rounds 2 --reps 20 \
  --providers own_portable,own_portable@nh,own_portable@w8,own_portable@w8h \
  --variant 'own_portable@nh={"forward":{"softcap_halves":false}}' \
  --variant "own_portable@w8={$T,\"softcap_halves\":false}}" \
  --variant "own_portable@w8h={$T,\"softcap_halves\":true}}" --out $OUT/sc30 > $OUT/sc30.log 2>&1
echo "rc $?"
for f in $OUT/sc30/round-*/results.csv; do python3 -c "
import csv
for r in csv.DictReader(open('$f')): print('$f'.split('/')[-2], r['provider'], r['ms'][:6], r['ms_p20'][:6], r['ms_p80'][:6], r['floor_ratio'][:5], r['loss_rel_err'][:8])
"; done
