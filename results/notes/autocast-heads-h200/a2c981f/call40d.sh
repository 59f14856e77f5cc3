#!/usr/bin/env bash
# call40d: the autocast target (bf16 autocast, fp32 weight) re-run at a2c981f, the kernel since
# the forward's split count in launch order (ee9cbde) and its pointer loads: the five shapes
# (the tool's defaults) and the three heads no preset names in two rounds. Carry .gpu/site.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.gpu/site:$PWD
mkdir -p "$OUT/autocast-h200" "$OUT/heads"
timeout 300 python3 -m suite kernel autocast --out "$OUT/autocast-h200" \
  > "$OUT/autocast-h200/autocast.log" 2>&1 || echo "five shapes: exit $?"
tail -14 "$OUT/autocast-h200/autocast.log"
SHAPES=d7168-v129280:4096:7168:129280,d2048-v49152:16384:2048:49152,d8192-v152064:8192:8192:152064
for r in 1 2; do
  timeout 130 python3 -m suite kernel autocast --out "$OUT/heads/round-$r" --shapes "$SHAPES" \
    --providers torch_compile,own,own_ws0 --budgets 2048,4096 --reps 20 \
    > "$OUT/heads/autocast-round-$r.log" 2>&1 || echo "round $r: exit $?"
  tail -12 "$OUT/heads/autocast-round-$r.log"
done
cd "$OUT" && tar czf /tmp/call.tgz . && mv /tmp/call.tgz ./call.tgz && ls -la call.tgz
