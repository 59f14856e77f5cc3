#!/usr/bin/env bash
# call39e: a lead, not a default: the Hopper forward (Gluon, forward_ws.py at D <= 3072) at
# N 16384, D 2048, V 49152, where it took 1.08-1.09 floors in call39c-d on this session's H200
# (its cuBLAS floor 5 % under the earlier GPUs'), beside N 16384, D 1152, V 262144: the TMA
# forward (ws off) and two L2 budgets for E's resident row blocks, interleaved (30 sweeps).
# Carry .gpu/site.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.gpu/site:$PWD
mkdir -p "$OUT"
show() { python3 -c "import csv
for r in csv.DictReader(open('$1')):
    print(r['head'], r['entry'], r['status'][:30], r['ms'], r['ms_p20'], r['ms_p80'], r['floors'], r['vs_base'])"; }
CCE_OWN_TUNE_CACHE=$OUT/tiles.json timeout 200 python3 -m suite kernel interleave \
  --out "$OUT/hopper-fwd" --heads 16384x2048x49152,16384x1152x262144 --phase fwd --reps 30 \
  --variants 'tma={"forward":{"ws":false}}' 'l2_0={"forward":{"l2_mib":0}}' \
  'l2_48={"forward":{"l2_mib":48}}' > "$OUT/hopper-fwd-log.txt" 2>&1
echo "interleaved: exit $?"; show "$OUT/hopper-fwd/interleave.csv"
cd "$OUT" && tar czf /tmp/call39e.tgz . && mv /tmp/call39e.tgz . && ls -la call39e.tgz
