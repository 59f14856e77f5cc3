#!/usr/bin/env bash
# call32d: at the frontier shapes where call32c's portable rows were slower than torch.compile
# (D 1152 at entropy 3, D 5120), the default and the 3 GiB budget against their fp32 logits
# (@fp32), one round; then the 32k head's second round. Carry .gpu/site.
set -u
export CCE_BENCH_COMMIT=${CCE_BENCH_COMMIT:?the commit}
export PYTHONPATH=$PWD/.gpu/site:$PWD
START=$SECONDS DEADLINE=${DEADLINE_S:-300}
left() { echo $(( DEADLINE - (SECONDS - START) )); }
mkdir -p "$OUT"
V='--variant own_portable@fp32={"fused":{"target_shift":false}} --variant own_portable_fused@fp32={"fused":{"target_shift":false}}'
P=own_portable,own_portable@fp32,own_portable_fused,own_portable_fused@fp32,torch_compile
RUN=/tmp/run/fp32-d1152 HEADS_DEADLINE_S=$(( $(left) - 170 )) ROUNDS=1 REPS=20 \
  HEADS=16384x1152x262144 PROVIDERS=$P BENCH_ARGS="--lm-entropy 3 $V" bash suite/kernel/heads_gpu.sh
RUN=/tmp/run/fp32-d5120 HEADS_DEADLINE_S=$(( $(left) - 60 )) ROUNDS=1 REPS=20 \
  HEADS=8192x5120x131072 PROVIDERS=$P BENCH_ARGS="$V" bash suite/kernel/heads_gpu.sh
RUN=/tmp/run/fp32-32k HEADS_DEADLINE_S=$(left) ROUNDS=1 REPS=20 HEADS=16384x4096x32000 \
  PROVIDERS=own_portable,torch_compile bash suite/kernel/heads_gpu.sh
