#!/usr/bin/env bash
# call36c: loss+grad with torch.compile, in one process (interleaved, 20 sweeps), the launch-order
# plan (the default since ee9cbde) against the split-order one (forward.makespan_order "split")
# at five heads whose forward grid it moves: N 4096 at D 8192, 3584 and 5120 (V 152064 and
# 151936), D 7168, V 129280 (DeepSeek V3's head), and N 8192, D 5120, V 131072 (the frontier's
# d5120). Outputs tarred. Carry .gpu/site.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.gpu/site:$PWD
export CCE_BENCH_COMMIT=${CCE_BENCH_COMMIT:?the commit}
R=$(mktemp -d); mkdir -p "$OUT"
timeout -k 5 ${CAP_S:-330} python3 -m suite kernel interleave --compile --reps 20 \
  --heads 4096x8192x152064,4096x3584x152064,4096x5120x151936,4096x7168x129280,8192x5120x131072 \
  --variants 'old={"forward":{"makespan_order":"split"}}' --out "$R/loss-grad" \
  > "$R/loss-grad.log" 2>&1
echo "loss+grad: exit $?"
tar -C "$R" -czf "$OUT/call36c.tgz" .
python3 - "$R/loss-grad/interleave.csv" <<'PY'
import csv, sys
for r in csv.DictReader(open(sys.argv[1])):
    print(*(r.get(k, "") for k in ("head", "entry", "chunks", "ms", "ms_p20", "ms_p80", "floors",
                                   "ms_over_base", "vs_base", "ms_over_compile", "vs_compile",
                                   "status")))
PY
