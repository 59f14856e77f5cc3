#!/usr/bin/env bash
# call33a: the portable default (1 GiB, target-shifted logits) at the frontier shapes where it
# was slower than torch.compile (call32c-e), against its own chunks aligned to 128 rows
# (@ra128) and capped at a power of two (@r2048), one round; then D 1152 (entropy 3) at
# torch.compile's memory (@tcmem: an 8800 MiB default budget, one chunk). Carry .gpu/site.
set -u
export CCE_BENCH_COMMIT=${CCE_BENCH_COMMIT:?the commit}
export PYTHONPATH=$PWD/.gpu/site:$PWD
START=$SECONDS DEADLINE=${DEADLINE_S:-330}
left() { echo $(( DEADLINE - (SECONDS - START) )); }
mkdir -p "$OUT"
RA='--variant own_portable@ra128={"fused":{"row_align":128}}'
R2='--variant own_portable@r2048={"fused":{"max_rows":2048}}'
TC='--variant own_portable@tcmem={"fused":{"default_workspace_mib":8800}}'
P=own_portable,own_portable@ra128,own_portable@r2048,torch_compile
RUN=/tmp/run/ra-d5120 HEADS_DEADLINE_S=$(( $(left) - 230 )) ROUNDS=1 REPS=20 \
  HEADS=8192x5120x131072 PROVIDERS=$P BENCH_ARGS="$RA $R2" bash suite/kernel/heads_gpu.sh
RUN=/tmp/run/ra-qwen HEADS_DEADLINE_S=$(( $(left) - 150 )) ROUNDS=1 REPS=20 \
  HEADS=16384x3584x152064 PROVIDERS=$P BENCH_ARGS="$RA $R2" bash suite/kernel/heads_gpu.sh
RUN=/tmp/run/ra-v151936 HEADS_DEADLINE_S=$(( $(left) - 90 )) ROUNDS=1 REPS=20 \
  HEADS=8192x1536x151936 PROVIDERS=$P BENCH_ARGS="$RA $R2" bash suite/kernel/heads_gpu.sh
RUN=/tmp/run/ra-d1152 HEADS_DEADLINE_S=$(left) ROUNDS=1 REPS=20 HEADS=16384x1152x262144 \
  PROVIDERS=own_portable,own_portable@ra128,own_portable@tcmem,torch_compile \
  BENCH_ARGS="--lm-entropy 3 $RA $TC" bash suite/kernel/heads_gpu.sh
