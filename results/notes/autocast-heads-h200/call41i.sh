#!/usr/bin/env bash
# call41i: call41h's autocast check at N 8192, D 8192, V 152064, where a 4 GiB budget runs one
# chunk. Carry .gpu/site.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.gpu/site:$PWD
mkdir -p "$OUT"
timeout 100 python3 -m suite kernel autocast --out "$OUT/d8192" \
  --shapes d8192-v152064:8192:8192:152064 --providers torch_compile,own --budgets 4096 \
  --reps 10 > "$OUT/d8192.log" 2>&1 || echo "autocast: exit $?"
tail -4 "$OUT/d8192.log"
