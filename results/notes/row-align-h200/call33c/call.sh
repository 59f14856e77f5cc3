#!/usr/bin/env bash
# call33c: second rounds of call33a's D 1152 (entropy 3: the default aligned to 128 rows
# against the 8-row alignment before it, @ra8, and an 8800 MiB default budget, @tcmem, one
# chunk at torch.compile's memory) and Qwen 2.5 (7B) (the default against @ra8), with
# torch.compile. Carry .gpu/site.
set -u
export CCE_BENCH_COMMIT=${CCE_BENCH_COMMIT:?the commit}
export PYTHONPATH=$PWD/.gpu/site:$PWD
START=$SECONDS DEADLINE=${DEADLINE_S:-300}
left() { echo $(( DEADLINE - (SECONDS - START) )); }
mkdir -p "$OUT"
RA='--variant own_portable@ra8={"fused":{"target_shift_row_align":8}}'
TC='--variant own_portable@tcmem={"fused":{"default_workspace_mib":8800}}'
RUN=/tmp/run/ra-d1152-2 HEADS_DEADLINE_S=$(( $(left) - 110 )) ROUNDS=1 REPS=20 \
  HEADS=16384x1152x262144 PROVIDERS=own_portable,own_portable@ra8,own_portable@tcmem,torch_compile \
  BENCH_ARGS="--lm-entropy 3 $RA $TC" bash suite/kernel/heads_gpu.sh
RUN=/tmp/run/ra-qwen-2 HEADS_DEADLINE_S=$(left) ROUNDS=1 REPS=20 HEADS=16384x3584x152064 \
  PROVIDERS=own_portable,own_portable@ra8,torch_compile BENCH_ARGS="$RA" \
  bash suite/kernel/heads_gpu.sh
