#!/usr/bin/env bash
# call40g: the portable target's loss+grad, forced on an H200 (call40c, call40e), was 0.89-0.92x
# torch.compile's time at V 49152, D 1152 and Gemma 2 (2B), where Hopper's default took
# 0.97-0.98x in the frontier's runs (another method: a process per provider). Same call, same
# board: (1) Hopper's config with its shifted logits (base) against the target-shifted ones
# (ts, the portable path's cuBLAS GEMM and pass), interleaved with torch.compile, at those three
# heads and N 4096, D 7168; (2) the portable target forced at the same heads, interleaved with
# torch.compile. Each ratio to torch.compile is within its own process. Carry .gpu/site.
set -u
export CCE_BENCH_COMMIT=${CCE_BENCH_COMMIT:?the commit}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.gpu/site:$PWD
mkdir -p "$OUT"
HEADS=16384x2048x49152,16384x1152x262144,8192x2304x256000x30,4096x7168x129280
TS='ts={"fused":{"logits_shifted":false,"target_shift":true,"target_shift_row_align":128}}'
show() { python3 - "$1" <<'PY'
import csv, sys
for r in csv.DictReader(open(sys.argv[1])):
    print(" ".join(str(r.get(k, "")) for k in ("head", "entry", "chunks", "ms", "ms_p20",
          "ms_p80", "floors", "ms_over_compile", "vs_base", "vs_compile", "peak_mib", "status")))
PY
}
timeout -k 5 170 python3 -m suite kernel interleave --out "$OUT/hopper" --compile \
  --heads "$HEADS" --variants "$TS" --reps 10 > "$OUT/hopper.log" 2>&1
echo "hopper: exit $?"; show "$OUT/hopper/interleave.csv"
CCE_OWN_TARGET=portable CCE_OWN_TUNE_CACHE=$OUT/tiles.json timeout -k 5 120 python3 -m suite \
  kernel interleave --out "$OUT/portable" --compile --heads "$HEADS" --reps 10 \
  > "$OUT/portable.log" 2>&1
echo "portable: exit $?"; show "$OUT/portable/interleave.csv"
cd "$OUT" && tar czf /tmp/call.tgz . && mv /tmp/call.tgz ./call.tgz
