#!/usr/bin/env bash
# call41d: (1) what the portable one-chunk call holds at its peak beyond the gradients and the
# logits, block by block down to 1 KiB (N 4096, D 7168, V 129280 at the default; V 49152 at
# 2 GiB); (2) N 8192, D 5120, V 131072 at the 1 GiB default and budgets of 2 and 3 GiB against a
# static torch.compile, two processes (call41a timed the default only there). Carry .gpu/site.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.gpu/site:$PWD CCE_OWN_TARGET=portable
mkdir -p "$OUT"
timeout 60 python3 -m suite kernel memory --n 4096 --d 7168 --v 129280 --softcap 0 \
  --list-kib 1 > "$OUT/memory-d7168.txt" 2>&1
echo "memory d7168: exit $?"; cat "$OUT/memory-d7168.txt"
timeout 60 python3 -m suite kernel memory --n 16384 --d 2048 --v 49152 --softcap 0 \
  --workspace-mib 2048 --list-kib 1 > "$OUT/memory-v49152.txt" 2>&1
echo "memory v49152: exit $?"; cat "$OUT/memory-v49152.txt"
for round in a b; do
  SECONDS=0
  CCE_OWN_TUNE_CACHE=$OUT/tiles-p.json timeout 120 python3 -m suite kernel interleave \
    --out "$OUT/d5120-$round" --heads 8192x5120x131072 --budgets default,2048,3072 --compile \
    --reps 10 > "$OUT/d5120-$round-log.txt" 2>&1
  echo "d5120 $round: exit $? in ${SECONDS}s"; tail -5 "$OUT/d5120-$round-log.txt"
done
cd "$OUT" && tar czf /tmp/call.tgz . && mv /tmp/call.tgz ./call.tgz && ls -la call.tgz
