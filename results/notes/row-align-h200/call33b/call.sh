#!/usr/bin/env bash
# call33b: the portable default's target-shifted chunks aligned to 128 rows (eab2819) against
# the 8-row alignment before it (@ra8), with torch.compile: two heads no preset names whose
# 1 GiB chunks are ragged (N 12288, D 3072, V 200064; N 8192, D 3584, V 152064), then a second
# round at D 5120 and N 8192, D 1536, V 151936. Last, the GPU tests of the target-shifted pass
# and the portable backward with the portable target forced. Carry .gpu/site.
set -u
export CCE_BENCH_COMMIT=${CCE_BENCH_COMMIT:?the commit}
export PYTHONPATH=$PWD/.gpu/site:$PWD
START=$SECONDS DEADLINE=${DEADLINE_S:-500}
left() { echo $(( DEADLINE - (SECONDS - START) )); }
mkdir -p "$OUT"
RA='--variant own_portable@ra8={"fused":{"target_shift_row_align":8}}'
P=own_portable,own_portable@ra8,torch_compile
RUN=/tmp/run/ra-heads HEADS_DEADLINE_S=$(( $(left) - 320 )) ROUNDS=1 REPS=20 \
  HEADS="12288x3072x200064 8192x3584x152064" PROVIDERS=$P BENCH_ARGS="$RA" \
  bash suite/kernel/heads_gpu.sh
RUN=/tmp/run/ra-frontier HEADS_DEADLINE_S=$(( $(left) - 240 )) ROUNDS=1 REPS=20 \
  HEADS="8192x5120x131072 8192x1536x151936" PROVIDERS=$P BENCH_ARGS="$RA" \
  bash suite/kernel/heads_gpu.sh
CCE_OWN_TARGET=portable CCE_TEST_DEVICE=cuda timeout -k 10 $(( $(left) - 10 )) \
  python3 -m pytest -v -rs -n 8 -p no:cacheprovider tests/test_target_shift.py \
  tests/test_backward_portable.py > "$OUT/gpu-tests.log" 2>&1
echo "gpu tests: exit $?"; grep -E "passed|failed|error" "$OUT/gpu-tests.log" | tail -n 3
