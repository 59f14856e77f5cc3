#!/usr/bin/env bash
# call32c: the portable config forced, target-shifted logits its default, at the frontier's
# other four shapes (frontier.md: Llama 3 (8B), D 5120, Qwen 2.5 (7B), D 1152 at entropy 3):
# the default (1 GiB) and the 3 GiB budget (torch.compile's memory) against torch.compile, one
# round each. Carry .gpu/site.
set -u
export CCE_BENCH_COMMIT=${CCE_BENCH_COMMIT:?the commit}
export PYTHONPATH=$PWD/.gpu/site:$PWD
START=$SECONDS DEADLINE=${DEADLINE_S:-500}
left() { echo $(( DEADLINE - (SECONDS - START) )); }
mkdir -p "$OUT"
RUN=/tmp/run/portable-frontier HEADS_DEADLINE_S=$(( $(left) - 110 )) ROUNDS=1 REPS=20 \
  HEADS="8192x4096x128256 8192x5120x131072 16384x3584x152064" \
  PROVIDERS=own_portable,own_portable_fused,torch_compile bash suite/kernel/heads_gpu.sh
RUN=/tmp/run/portable-d1152 HEADS_DEADLINE_S=$(left) ROUNDS=1 REPS=20 HEADS=16384x1152x262144 \
  PROVIDERS=own_portable,own_portable_fused,torch_compile BENCH_ARGS='--lm-entropy 3' \
  bash suite/kernel/heads_gpu.sh
