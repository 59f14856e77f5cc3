#!/usr/bin/env bash
# call39a: the pointer k-loop's loads from pointers fixed before the loop (forward.fixed_base_loads
# and dlogits_fixed_base_loads, both off): base + d0 each k-step instead of every pointer stepped
# by the tile's depth, which a local sm90 compile (Triton 3.6) took from 125 to 76 instructions
# per k-step in bounds. (1) The GPU test (bit for bit against the masked loads); (2) the forward
# forced portable at four heads, pinned pick and autotuned, interleaved; (3) the same blocked,
# 3 untimed calls a block, with clocks; (4) the W writer, loss+grad low_memory at two heads,
# interleaved and blocked; (5) ncu source counters of the pinned forward with fixed base at
# N 16384, D 2048, V 49152 (call38a's head). Carry .gpu/site.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.gpu/site:$PWD
mkdir -p "$OUT"
timeout 150 env CCE_TEST_DEVICE=cuda python3 -m pytest -q -p no:cacheprovider \
  tests/test_pointer_loads.py > "$OUT/gpu-tests.log" 2>&1
echo "gpu tests: exit $?"; tail -2 "$OUT/gpu-tests.log"
export CCE_OWN_TARGET=portable
PIN='"autotune":false,"forward":{"tiles":{"block_n":128,"block_v":256,"block_d":64,"num_warps":8,"num_stages":3}'
HEADS=16384x2048x49152,16384x1152x262144,8192x1536x151936,8192x2304x256000x30
VARIANTS=("pin={$PIN}}" "pin_fixed={$PIN,\"fixed_base_loads\":true}}"
          'fixed={"forward":{"fixed_base_loads":true}}')
show() { python3 -c "import csv
for r in csv.DictReader(open('$1')):
    print(r['head'], r['entry'], r['status'][:30], r['ms'], r['ms_p20'], r['ms_p80'], r['floors'], r['vs_base'], r.get('sm_mhz', ''))"; }
CCE_OWN_TUNE_CACHE=$OUT/tiles-i.json timeout 170 python3 -m suite kernel interleave \
  --out "$OUT/interleaved" --heads "$HEADS" --phase fwd --reps 30 --variants "${VARIANTS[@]}" \
  > "$OUT/interleaved-log.txt" 2>&1
echo "interleaved: exit $?"; show "$OUT/interleaved/interleave.csv"
CCE_OWN_TUNE_CACHE=$OUT/tiles-b.json timeout 170 python3 -m suite kernel interleave \
  --out "$OUT/blocked" --heads "$HEADS" --phase fwd --reps 30 --order blocked --settle 3 \
  --clocks --variants "${VARIANTS[@]}" > "$OUT/blocked-log.txt" 2>&1
echo "blocked: exit $?"; show "$OUT/blocked/interleave.csv"
W_HEADS=16384x2048x49152,8192x1536x151936
W_VAR='fixed={"dlogits_fixed_base_loads":true}'
CCE_OWN_TUNE_CACHE=$OUT/tiles-w.json timeout 110 python3 -m suite kernel interleave \
  --out "$OUT/w-low-memory" --heads "$W_HEADS" --variants "$W_VAR" --reps 15 --low-memory \
  > "$OUT/w-low-memory-log.txt" 2>&1
echo "w interleaved: exit $?"; show "$OUT/w-low-memory/interleave.csv"
head=16384x2048x49152; IFS=x read -r n d v <<< "$head"
CCE_OWN_CONFIG="{$PIN,\"fixed_base_loads\":true}}" timeout -k 5 100 ncu --clock-control none \
  -k regex:"cce_fwd_kernel" --launch-count 1 --section SpeedOfLight \
  --section WarpStateStats --section SourceCounters \
  --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active \
  -o "$OUT/fwd-fixed-$head" python3 -m suite kernel profile fwd --n "$n" --d "$d" --v "$v" \
  --softcap 0 > "$OUT/ncu-fixed-$head.log" 2>&1
echo "ncu: exit $?"
ncu -i "$OUT/fwd-fixed-$head.ncu-rep" --page source --csv --print-source sass \
  -k cce_fwd_kernel 2> "$OUT/sass-$head.err" | gzip > "$OUT/sass-$head.csv.gz"
ncu -i "$OUT/fwd-fixed-$head.ncu-rep" --page details --csv > "$OUT/details-$head.csv" 2>&1
grep -E "Duration|hmma" "$OUT/details-$head.csv" | head -3
rm -f "$OUT"/*.ncu-rep
cd "$OUT" && tar czf /tmp/call39a.tgz . && mv /tmp/call39a.tgz . && ls -la call39a.tgz
